"""A replay client plans across sites (issue 23): its own site computes, and a source placed on
another site is answered from what that site's archiver publishes; the request names it."""

from __future__ import annotations

import pytest

import confserver
from ramen import keyspace
from ramen.archive.coverage import Interval
from ramen.archive.coverage_key import ArchiveCoverage
from ramen.program import loads
from ramen.replay.client import Replay, ReplayFailed
from ramen.replay.contract import ReplayRequest
from ramen.replay.plan import ReplayGapError

PROGRAM = """
[program]
name = "x"

[[function]]
name = "src"
site = "edge"
source = { kind = "generator", rate = 10 }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }

[[function]]
name = "everywhere"
source = { kind = "generator", rate = 10 }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }

[[function]]
name = "on_edge"
site = "edge"
lazy = true
from = ["src"]
engine = "python"
call = "tests.e2e.site_calls:per_window"
event_time = "start"

[[function]]
name = "doubled"
site = "core"
lazy = true
from = ["src"]
engine = "python"
call = "tests.e2e.site_calls:per_window"
event_time = "start"

[[function]]
name = "from_edge_compute"
site = "core"
lazy = true
from = ["on_edge"]
engine = "python"
call = "tests.e2e.site_calls:same"
event_time = "start"

[[function]]
name = "of_everywhere"
site = "core"
lazy = true
from = ["everywhere"]
engine = "python"
call = "tests.e2e.site_calls:per_window"
event_time = "start"
"""


@pytest.fixture
def client(fresh_confserver, tmp_path, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path / "core"))  # the core's own archive: empty
    with confserver.connect(fresh_confserver.url, identity="admin", auth_file=fresh_confserver.auth_file) as c:
        # The edge's archiver publishes both of its functions' coverage.
        c.set(keyspace.archive_coverage_key("edge"), ArchiveCoverage.of(
            {"x/src": [Interval(0, 1000)], "x/everywhere": [Interval(0, 1000)]}, updated_us=1).to_value())
        yield c


def programs():
    program = loads(PROGRAM)
    return {program.name: program}


def test_a_source_placed_on_another_site_is_planned_from_its_published_coverage_and_named_in_the_request(client):
    replay = Replay(client, programs(), "x/doubled", 100, 200, site="core")
    assert replay.plan.sources == ("x/src",) and replay.plan.workers == ("x/doubled",)
    assert replay.source_sites == {"x/src": "edge"}
    request = ReplayRequest.from_value(replay.request())
    assert (request.site, request.source_sites) == ("core", {"x/src": "edge"})


def test_a_function_computed_on_another_site_is_refused_in_one_line(client):
    with pytest.raises(ReplayFailed, match=r"^x/on_edge runs on site edge, not core: replay x/from_edge_compute "
                                           r"with --site edge --via-confserver"):
        Replay(client, programs(), "x/from_edge_compute", 100, 200, site="core")


def test_a_source_of_every_site_is_answered_by_the_own_sites_archive_only(client):
    """Each site runs its own copy of an unplaced function: the edge's archive of it is not ours."""
    with pytest.raises(ReplayGapError, match="x/everywhere"):
        Replay(client, programs(), "x/of_everywhere", 100, 200, site="core")


def test_a_site_that_publishes_no_coverage_covers_nothing(client):
    client.delete(keyspace.archive_coverage_key("edge"))
    with pytest.raises(ReplayGapError, match="x/src"):
        Replay(client, programs(), "x/doubled", 100, 200, site="core")


def test_explain_names_the_site_of_a_source_archived_elsewhere(client):
    from ramen import paths
    from ramen.replay.client import replay_coverage, source_sites
    from ramen.replay.explain import explain
    found = explain("x/doubled", 100, 200, programs(), replay_coverage(client, programs(), "core"),
                    paths.archive_dir("core"), source_sites=lambda plan: source_sites(plan, programs(), "core"))
    assert found.to_dict()["sources"] == [{"function": "x/src", "site": "edge", "recordings": []}]
    assert "source     x/src: archived on site edge, read by its replayer there" in found.lines()
    assert found.functions == ("x/doubled",)
