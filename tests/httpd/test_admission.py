"""httpd's admission of long replays (ramen/httpd/admission.py): slots taken in turn, a bounded
queue, refusal past it, a waiting render cancelled; and, through the app, a 503 with Retry-After.
And of memory: each render's estimate bounded before it fetches, the renders running bounded
together, a piece they share reserved once."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from aiohttp.test_utils import TestClient, TestServer

from ramen import keyspace
from ramen.httpd import buckets
from ramen.httpd.admission import AdmissionLimits, Overloaded, RenderCancelled, RenderMemory, ReplaySlots
from ramen.httpd.app import make_app
from ramen.httpd.state import Httpd, Limits
from ramen.program import loads
from ramen.replay import summary as summaries
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


def test_render_memory_holds_a_shared_piece_once_lets_a_render_alone_in_and_refuses_one_past_the_bound():
    memory = RenderMemory(AdmissionLimits(max_bytes=100))
    memory.reserve({"a": 150})  # alone: its own bound was checked before
    memory.reserve({"a": 150})  # the same piece for another render (a dashboard's panels): not again
    assert memory.reserved == 150
    with pytest.raises(Overloaded, match="estimated to take 0 MiB, and this one 0 MiB more"):
        memory.reserve({"a": 150, "b": 1})  # all or none
    assert memory.reserved == 150
    memory.release(["a"])
    assert memory.reserved == 150  # the other render still holds it
    memory.release(["a"])
    memory.reserve({"b": 60})
    memory.reserve({"c": 40})
    with pytest.raises(Overloaded):
        memory.reserve({"d": 1})
    memory.release(["b"])
    memory.release(["c"])
    assert memory.reserved == 0


PROGRAM = ('[program]\nname = "{name}"\n\n[[function]]\nname = "f"\n'
           'source = {{ kind = "generator", rate = 10, hosts = 2 }}\n'
           'schema = {{ ts = "timestamp[us]", host = "string", bytes = "int64" }}\nevent_time = "ts"\n'
           'factors = ["host"]\narchive = {{ retention = "1d" }}\n')


def fifty_hosts_known(httpd: Httpd, program) -> None:
    """As if a render had met 50 hosts of the function (FactorValues.remember)."""
    function = program.function("f")
    rows = pa.table({"ts": pa.array([0] * 50, pa.timestamp("us")), "host": [f"host{i:02}" for i in range(50)],
                     "bytes": pa.array(range(50), pa.int64())})
    httpd.factor_values.remember(function, summaries.aggregate(buckets.summary_of(function), function, rows))


@sync
async def test_a_render_estimated_past_its_memory_bound_is_refused_in_one_line_before_any_replay(client):
    """No supervisor runs here: a render that got as far as its replays would wait for them. 50 hosts
    of a 10 s function over a day: 432,000 buckets of 48 bytes, about 20 MiB, against 16 MiB."""
    program = loads(PROGRAM.format(name="mem"))
    client.set(f"{keyspace.PROGRAMS}/mem", program.to_dict())
    httpd = Httpd(client, "httpd-test", limits=Limits(max_render_bytes=16 << 20))
    fifty_hosts_known(httpd, program)
    http = TestClient(TestServer(make_app(httpd)))
    await http.start_server()
    try:
        answer = await http.get("/render?target=sumSeries(mem.f.*.bytes)&from=-1d&noCache=1")
        assert answer.status == 400
        assert await answer.text() == ("render: would take about 20 MiB (mem/f over 1.0 days alone about 20 MiB, "
                                       "every value of its factors known), more than 16 MiB: ask a shorter range or "
                                       "fewer series\n")
        assert httpd.memory.reserved == 0
    finally:
        await http.close()


@sync
async def test_a_render_past_what_the_renders_running_may_take_together_is_a_503_and_their_memory_goes_back(client):
    """The first render holds its estimate while its replay waits for a slot (none is free); the
    second, of another range, would take them past the bound; once a slot is free, the first ends
    and gives its memory back."""
    program = loads(PROGRAM.format(name="mem2"))
    client.set(f"{keyspace.PROGRAMS}/mem2", program.to_dict())
    httpd = Httpd(client, "httpd-test", admission=AdmissionLimits(max_running=0, max_bytes=24 << 20))
    fifty_hosts_known(httpd, program)
    http = TestClient(TestServer(make_app(httpd)))
    await http.start_server()
    try:
        first = asyncio.ensure_future(http.get("/render?target=sumSeries(mem2.f.*.bytes)&from=-1d&noCache=1"))
        await asyncio.get_running_loop().run_in_executor(None, wait_for, lambda: httpd.fetcher.slots.waiting,
                                                         "the first render's replay waiting for a slot")
        assert httpd.memory.reserved in (50 * 8_640 * 48, 50 * 8_641 * 48)  # 50 hosts, a day of 10 s steps
        answer = await http.get("/render?target=sumSeries(mem2.f.*.bytes)&from=-2d&until=-1d&noCache=1")
        assert answer.status == 503 and int(answer.headers["Retry-After"]) > 0
        assert "the renders running are estimated to take 20 MiB, and this one 20 MiB more, past the 24 MiB" in \
            await answer.text()
        httpd.fetcher.slots.limits = AdmissionLimits()  # slots free: the first goes on
        assert (await first).status == 200
        assert httpd.memory.reserved == 0
    finally:
        await http.close()
