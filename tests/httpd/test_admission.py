"""httpd's admission of long replays (ramen/httpd/admission.py): slots taken in turn, a bounded
queue, refusal past it, a waiting render cancelled; and, through the app, a 503 with Retry-After."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ramen import keyspace
from ramen.httpd.admission import AdmissionLimits, Overloaded, RenderCancelled, ReplaySlots
from ramen.program import loads
from tests.httpd.test_app import serve, sync
from tests.waiting import wait_for

LONG_S = 3600


def holder(slots: ReplaySlots, stop: threading.Event, release: threading.Event, entered: list) -> None:
    with slots.held(LONG_S, stop):
        entered.append(threading.current_thread().name)
        release.wait()


def test_long_replays_take_slots_in_turn_wait_within_a_bound_and_are_refused_past_it():
    slots = ReplaySlots(AdmissionLimits(max_running=1, max_waiting=1, light_s=60))
    first_done, second_done, never = threading.Event(), threading.Event(), threading.Event()
    entered: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(holder, slots, never, first_done, entered)
        wait_for(lambda: slots.running == 1, "the first replay in its slot")
        second = pool.submit(holder, slots, never, second_done, entered)
        wait_for(lambda: slots.waiting == 1, "the second replay waiting")
        with pytest.raises(Overloaded, match="runs 1 long replays and 1 wait") as refused:
            with slots.held(LONG_S, never):
                pass
        assert refused.value.retry_after_s > 0
        with slots.held(60, never):  # a short replay (a refresh's newest minute) takes no slot
            assert (slots.running, slots.waiting) == (1, 1)
        first_done.set()
        first.result()
        wait_for(lambda: len(entered) == 2, "the second replay in the slot the first left")
        assert (slots.running, slots.waiting) == (1, 0)
        second_done.set()
        second.result()
    assert (slots.running, slots.waiting) == (0, 0)


def test_a_replay_waiting_for_a_slot_leaves_the_queue_when_its_renders_are_gone():
    slots = ReplaySlots(AdmissionLimits(max_running=1, max_waiting=4, light_s=0))
    release, stop = threading.Event(), threading.Event()
    entered: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(holder, slots, threading.Event(), release, entered)
        wait_for(lambda: slots.running == 1, "a replay in the slot")
        waiting = pool.submit(holder, slots, stop, threading.Event(), entered)
        wait_for(lambda: slots.waiting == 1, "a replay waiting")
        stop.set()
        with pytest.raises(RenderCancelled):
            waiting.result(timeout=30)
        assert (slots.running, slots.waiting, len(entered)) == (1, 0, 1)
        release.set()
        running.result()
    assert slots.running == 0


@sync
async def test_a_render_past_the_queue_is_a_503_with_retry_after_alone_and_in_a_batch(client):
    """No supervisor runs here: the render is refused before its replay is asked."""
    program = loads('[program]\nname = "adm"\n\n[[function]]\nname = "f"\n'
                    'source = { kind = "generator", rate = 10, hosts = 2 }\n'
                    'schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }\nevent_time = "ts"\n'
                    'factors = ["host"]\narchive = { retention = "1d" }\n')
    client.set(f"{keyspace.PROGRAMS}/adm", program.to_dict())
    http = await serve(client, admission=AdmissionLimits(max_running=0, max_waiting=0, light_s=0))
    try:
        answer = await http.get("/render?target=sumSeries(adm.f.*.bytes)&from=-1h&noCache=1")
        assert answer.status == 503
        assert int(answer.headers["Retry-After"]) > 0
        assert "the most it takes: try again" in await answer.text()
        answer = await http.post("/render/batch", json={"from": "-1h", "until": "now", "renders": [
            {"targets": ["adm.f.host0.bytes"], "noCache": True}]})
        (refused,) = await answer.json()
        assert refused["status"] == 503 and "try again" in refused["error"]
        metrics = await (await http.get("/metrics")).text()
        assert 'ramen_httpd_renders_refused_total{site="httpd-test"} 2' in metrics
    finally:
        await http.close()
