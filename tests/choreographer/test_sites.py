"""Functions placed on sites, and the netd keys that carry streams between sites (choreographer/sites.py)."""

from __future__ import annotations

import functools
import threading

import pytest

import confserver
from choreographer.graph import build_graph, compute_usage
from choreographer.service import Choreographer, run
from choreographer.sites import LIVE_SEND_TETHER_HOLD_S, net_keys, stream_id
from ramen import keyspace, paths
from ramen.netd.contract import NetEndpoint, NetReceive, NetSend
from ramen.program import ProgramError, function_id, loads
from tests import waiting
from tests.choreographer.programs import program

wait_for = functools.partial(waiting.wait_for, timeout_s=10.0, poll_s=0.01)
EDGE_ENDPOINT = "aeron:udp?endpoint=127.0.0.1:40001"
CORE_ENDPOINT = "aeron:udp?endpoint=127.0.0.1:40002"
# src runs on the edge only, per_host on the core only; both_sides runs everywhere.
PLACED = [("src", False, [], "edge"), ("per_host", False, ["net/src"], "core"), ("both_sides", True, ["net/src"])]


def keys_of(functions, site, endpoints, replays=None):
    graph = build_graph([program("net", functions)])
    return net_keys(graph, compute_usage(graph, replays or {}), site, endpoints)


def test_a_site_is_part_of_the_program_version_not_of_the_signature():
    placed = program("net", [("src", False, [], "edge")])
    anywhere = program("net", [("src", False, [])])
    assert placed.function("src").site == "edge" and anywhere.function("src").site is None
    assert placed.version != anywhere.version
    assert placed.function("src").signature == anywhere.function("src").signature
    assert type(placed).from_dict(placed.to_dict()).function("src").site == "edge"


def test_a_bad_site_name_is_a_program_error():
    with pytest.raises(ProgramError, match="site 'no/slash'"):
        loads('[program]\nname = "p"\n[[function]]\nname = "s"\nsite = "no/slash"\n'
              'source = { kind = "generator" }\nschema = { ts = "timestamp[us]" }\n', "p.toml")


def test_the_child_site_receives_its_remote_parent_where_its_worker_reads_it():
    keys = keys_of(PLACED, "core", {"edge": EDGE_ENDPOINT, "core": CORE_ENDPOINT})
    receive = NetReceive.from_value(keys[f"{keyspace.net_receives_prefix('core')}/net/src"])
    assert receive == NetReceive(stream_id=stream_id("net/src"), log=str(paths.received_log("core", "net/src")))
    assert receive.log == str(paths.parent_log("core", "net/src", "edge")) != str(paths.parent_log("core", "net/src", None))
    assert stream_id("net/src") == function_id("net/src") - (1 << 32) * (function_id("net/src") >= 1 << 31)
    assert len(keys) == 1  # the core sends nothing: nothing of it is read elsewhere


def test_the_parent_site_sends_to_each_site_where_a_used_child_runs_without_it():
    keys = keys_of(PLACED, "edge", {"edge": EDGE_ENDPOINT, "core": CORE_ENDPOINT})
    send = NetSend.from_value(keys[f"{keyspace.net_sends_prefix('edge')}/net/src@core"])
    # A live stream: its writer waits for the core's netd while it restarts (tethered).
    assert send == NetSend(log=str(paths.output_log("edge", "net/src")), channel=CORE_ENDPOINT,
                           tether_hold_s=LIVE_SEND_TETHER_HOLD_S)
    # both_sides is lazy and unused: it asks for no stream; a site without endpoint gets none.
    assert list(keys) == [f"{keyspace.net_sends_prefix('edge')}/net/src@core"]
    assert keys_of(PLACED, "edge", {"edge": EDGE_ENDPOINT}) == {}


def test_a_function_on_every_site_is_read_locally_and_never_sent():
    functions = [("src", False, []), ("per_host", False, ["net/src"], "core")]
    assert keys_of(functions, "core", {"edge": EDGE_ENDPOINT, "core": CORE_ENDPOINT}) == {}
    assert keys_of(functions, "edge", {"edge": EDGE_ENDPOINT, "core": CORE_ENDPOINT}) == {}


def test_an_unplaced_used_child_needs_its_placed_parent_on_every_other_site():
    functions = [("src", False, [], "edge"), ("everywhere", False, ["net/src"])]
    endpoints = {"edge": EDGE_ENDPOINT, "core": CORE_ENDPOINT, "lab": "aeron:udp?endpoint=127.0.0.1:40003"}
    assert sorted(keys_of(functions, "edge", endpoints)) == [
        f"{keyspace.net_sends_prefix('edge')}/net/src@core", f"{keyspace.net_sends_prefix('edge')}/net/src@lab"]
    assert list(keys_of(functions, "lab", endpoints)) == [f"{keyspace.net_receives_prefix('lab')}/net/src"]


# -- two choreographers, one confserver --------------------------------------------------------------

@pytest.fixture
def admin(fresh_confserver):
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
        yield c


@pytest.fixture
def choreographers(fresh_confserver):
    running = []
    for site in ("edge", "core"):
        client = confserver.connect(fresh_confserver.url, identity="choreographer",
                                    auth_file=fresh_confserver.auth_file)
        service = Choreographer(client, site)
        stop = threading.Event()
        thread = threading.Thread(target=run, args=(service, stop), daemon=True)
        thread.start()
        running.append((service, stop, thread, client))
    yield [service for service, *_ in running]
    for service, stop, thread, client in running:
        stop.set()
        thread.join(5)
        service.close()
        client.close()


def site_keys(admin, site: str) -> dict[str, dict]:
    return {e.key: e.value for e in admin.glob(f"{keyspace.SITES}/{site}/**")}


def workers_of(admin, site: str) -> set[str]:
    return {keyspace.qualified_name_of(k) for k in site_keys(admin, site) if k.endswith("/worker")}


def test_each_site_runs_its_functions_and_wires_the_stream_between_them(admin, choreographers):
    admin.set(keyspace.program_key("net"), program("net", PLACED).to_dict())
    admin.set(f"{keyspace.net_sends_prefix('edge')}/by-hand", NetSend("/tmp/x", EDGE_ENDPOINT).to_value())
    # Each site's choreographer writes its own keys, in its own time: wait for both.
    wait_for(lambda: workers_of(admin, "core") == {"net/per_host", "net/both_sides"}, "the core's workers")
    wait_for(lambda: workers_of(admin, "edge") == {"net/src", "net/both_sides"}, "the edge's workers")
    receive = f"{keyspace.net_receives_prefix('core')}/net/src"
    wait_for(lambda: receive in site_keys(admin, "core"))
    send = f"{keyspace.net_sends_prefix('edge')}/net/src@core"
    assert send not in site_keys(admin, "edge")  # the core's netd has not announced itself

    # The core's netd comes up: the edge sends to it; it goes away: the edge stops.
    admin.create(keyspace.net_endpoint_key("core"), NetEndpoint(CORE_ENDPOINT, pid=1).to_value())
    wait_for(lambda: send in site_keys(admin, "edge"))
    assert NetSend.from_value(site_keys(admin, "edge")[send]).channel == CORE_ENDPOINT
    admin.delete(keyspace.net_endpoint_key("core"))
    wait_for(lambda: send not in site_keys(admin, "edge"))
    # A key the choreographer did not name after a function is left alone.
    assert f"{keyspace.net_sends_prefix('edge')}/by-hand" in site_keys(admin, "edge")

    # src no longer placed on the edge: it runs on both sites, and the core reads its own.
    admin.set(keyspace.program_key("net"), program("net", [("src", False, []), *PLACED[1:]]).to_dict())
    wait_for(lambda: receive not in site_keys(admin, "core"))
    assert keyspace.worker_key("core", "net/src") in site_keys(admin, "core")
