"""Replay planning: the target's own archive when it covers the range, else its parents',
recursively; diamonds planned once; gaps, unknown targets and empty ranges as one-line errors;
the plan's JSON form."""

import pytest

from ramen.archive.coverage import Interval
from ramen.program import loads
from ramen.replay.plan import ReplayGapError, ReplayPlan, ReplayPlanError, holes, plan_replay, uncovered_warning
from ramen.times import format_time, parse_time

MINUTE = 60_000_000
HOUR = 60 * MINUTE
T10 = parse_time("2026-11-20T10:00Z", 0)
"""10:00 UTC on the day the examples use."""


def at(hh_mm: str) -> int:
    return parse_time(f"2026-11-20T{hh_mm}Z", 0)


def program_text(name: str, functions: dict[str, tuple[list[str], bool]]) -> str:
    """A program of parquet sources (no parents) and Spark functions: name -> (parents, archived)."""
    parts = [f'[program]\nname = "{name}"\n']
    for function, (parents, archived) in functions.items():
        parts.append(f'[[function]]\nname = "{function}"\n')
        if parents:
            table = parents[0].rpartition("/")[2]
            parts.append(f'from = {parents!r}\nengine = "spark"\nsql = "SELECT ts, bytes FROM {table}"\n'
                         .replace("'", '"'))
        else:
            parts.append(f'source = {{ kind = "parquet", path = "{function}.parquet" }}\n')
        parts.append('schema = { ts = "timestamp[us]", bytes = "int64" }\nevent_time = "ts"\n')
        if archived:
            parts.append('archive = { retention = "7d" }\n')
    return "\n".join(parts)


# traffic ─┬─ left ──┬─ both ── top
#          └─ right ─┘
# dns ──────────────── mixed (from left and dns)
NET = {
    "traffic": ([], True),
    "dns": ([], True),
    "left": (["traffic"], True),
    "right": (["traffic"], False),
    "both": (["left", "right"], False),
    "top": (["both"], True),
    "mixed": (["left", "dns"], False),
    "raw": ([], False),
    "from_raw": (["raw"], False),
}


@pytest.fixture(scope="module")
def programs():
    return {"net": loads(program_text("net", NET), "net.toml")}


def full(since="09:00", until="12:00"):
    return [Interval(at(since), at(until))]


def test_a_target_covered_by_its_own_archive_is_its_only_source(programs):
    """Its own worker passes the replay on to the recipient: the one source that is also a worker."""
    plan = plan_replay("net/top", T10, T10 + HOUR, programs, {"net/top": full(), "net/traffic": full()})
    assert plan == ReplayPlan("net/top", T10, T10 + HOUR, sources=("net/top",), links=(), functions=("net/top",))
    assert plan.workers == ("net/top",) and plan.readers_of("net/top") == ("net/top",)


def test_a_target_without_an_archive_is_answered_by_its_parents(programs):
    plan = plan_replay("net/mixed", T10, T10 + HOUR, programs, {"net/left": full(), "net/dns": full()})
    assert plan.sources == ("net/dns", "net/left")
    assert plan.links == (("net/dns", "net/mixed"), ("net/left", "net/mixed"))
    assert plan.functions == ("net/dns", "net/left", "net/mixed")
    assert plan.inputs_of("net/mixed") == ("net/dns", "net/left")
    assert plan.inputs_of("net/left") == ()


def test_a_partly_covering_own_archive_is_not_used(programs):
    coverage = {"net/top": full("10:30", "12:00"), "net/left": full(), "net/traffic": full()}
    plan = plan_replay("net/top", T10, T10 + HOUR, programs, coverage)
    assert "net/top" not in plan.sources
    assert plan.sources == ("net/left", "net/traffic")


def test_a_diamond_is_planned_once_with_both_paths(programs):
    plan = plan_replay("net/top", T10, T10 + HOUR, programs, {"net/traffic": full()})
    assert plan.sources == ("net/traffic",)
    assert plan.links == (("net/both", "net/top"), ("net/left", "net/both"), ("net/right", "net/both"),
                          ("net/traffic", "net/left"), ("net/traffic", "net/right"))
    assert plan.functions == ("net/both", "net/left", "net/right", "net/top", "net/traffic")
    assert plan.workers == ("net/both", "net/left", "net/right", "net/top")  # the replayer stands in for traffic
    assert plan.readers_of("net/traffic") == ("net/left", "net/right")


def test_in_a_mixed_diamond_one_parent_covers_and_the_other_recurses_to_its_own_parent(programs):
    plan = plan_replay("net/both", T10, T10 + HOUR, programs, {"net/left": full(), "net/traffic": full()})
    assert plan.sources == ("net/left", "net/traffic")  # left answers itself; right needs traffic
    assert plan.links == (("net/left", "net/both"), ("net/right", "net/both"), ("net/traffic", "net/right"))
    assert plan.functions == ("net/both", "net/left", "net/right", "net/traffic")
    assert plan.workers == ("net/both", "net/right")
    assert plan.readers_of("net/left") == ("net/both",) and plan.readers_of("net/traffic") == ("net/right",)


def test_a_covered_function_stops_the_recursion_even_if_its_parents_cover_too(programs):
    plan = plan_replay("net/mixed", T10, T10 + HOUR, programs,
                       {"net/left": full(), "net/traffic": full(), "net/dns": full()})
    assert "net/traffic" not in plan.functions
    assert plan.sources == ("net/dns", "net/left")


def test_coverage_of_a_function_that_is_not_archived_is_never_used(programs):
    plan = plan_replay("net/both", T10, T10 + HOUR, programs,
                       {"net/right": full(), "net/left": full(), "net/traffic": full()})
    assert plan.sources == ("net/left", "net/traffic")


def test_merged_intervals_cover_the_range_only_as_one_interval(programs):
    # The planner receives merged coverage; two separate intervals leave the hole between them.
    with pytest.raises(ReplayGapError):
        plan_replay("net/traffic", T10, T10 + HOUR, programs,
                    {"net/traffic": [Interval(at("09:00"), at("10:30")), Interval(at("10:31"), at("12:00"))]})


def test_a_windowed_archive_covers_up_to_the_end_of_its_last_window():
    text = program_text("w", {"traffic": ([], True), "per_minute": (["traffic"], True)})
    text = text.replace('name = "per_minute"\n', 'name = "per_minute"\nwindow = { every = "1 minute" }\n')
    programs = {"w": loads(text, "w.toml")}
    last_window_start = at("10:59")
    coverage = {"w/per_minute": [Interval(T10, last_window_start + 1)], "w/traffic": full()}
    assert plan_replay("w/per_minute", T10, T10 + HOUR, programs, coverage).sources == ("w/per_minute",)
    assert plan_replay("w/per_minute", T10, at("11:01"), programs, coverage).sources == ("w/traffic",)
    # Recordings less than a window apart join: no window can have been missed between them.
    coverage["w/per_minute"] = [Interval(T10, at("10:30") + 1), Interval(at("10:31"), last_window_start + 1)]
    assert plan_replay("w/per_minute", T10, T10 + HOUR, programs, coverage).sources == ("w/per_minute",)


def test_a_plan_round_trips_through_json(programs):
    plan = plan_replay("net/top", T10, T10 + HOUR, programs, {"net/traffic": full()})
    assert ReplayPlan.from_json(plan.to_json()) == plan
    with pytest.raises(ValueError, match="format"):
        ReplayPlan.from_json('{"format": 99}')


@pytest.mark.parametrize("coverage, message", [
    (full("10:20", "12:00"), "no archive of net/traffic before 2026-11-20T10:20Z"),
    (full("09:00", "10:45"), "no archive of net/traffic after 2026-11-20T10:45Z"),
    (full("10:20", "10:40"), "no archive of net/traffic before 2026-11-20T10:20Z or after 2026-11-20T10:40Z"),
    ([Interval(at("09:00"), at("10:15")), Interval(at("10:30"), at("12:00"))],
     "no archive of net/traffic covers 2026-11-20T10:15Z..10:30Z"),
    ([Interval(at("09:00"), at("10:15")), Interval(at("10:30"), at("10:40")), Interval(at("10:50"), at("12:00"))],
     "no archive of net/traffic covers 2026-11-20T10:15Z..10:30Z (and 1 more gap up to 11:00Z)"),
    (full("11:42", "12:00"), "no archive of net/traffic covers 2026-11-20T10:00Z..11:00Z (oldest: 11:42Z)"),
    (full("08:00", "09:30"), "no archive of net/traffic covers 2026-11-20T10:00Z..11:00Z (newest: 09:30Z)"),
    ([], "no archive of net/traffic covers 2026-11-20T10:00Z..11:00Z"),
    ([Interval(at("10:20") + 500_000, at("10:40") + 59_999_999)],
     "no archive of net/traffic before 2026-11-20T10:20:01Z or after 2026-11-20T10:40:59Z"),
], ids=["before", "after", "both-ends", "middle-hole", "several-holes", "all-after", "all-before", "none",
        "seconds-rounded-inward"])
def test_a_gap_names_the_source_and_the_uncovered_part(programs, coverage, message):
    with pytest.raises(ReplayGapError) as caught:
        plan_replay("net/top", T10, T10 + HOUR, programs, {"net/traffic": coverage})
    assert str(caught.value) == message
    assert caught.value.function == "net/traffic"
    assert "\n" not in message


def test_a_gap_is_reported_from_the_parent_that_has_it(programs):
    with pytest.raises(ReplayGapError) as caught:
        plan_replay("net/mixed", T10, T10 + HOUR, programs, {"net/left": full(), "net/dns": full("10:05", "12:00")})
    assert str(caught.value) == "no archive of net/dns before 2026-11-20T10:05Z"
    assert (caught.value.gap_since_us, caught.value.gap_until_us) == (T10, at("10:05"))


def test_a_source_that_is_not_archived_says_so(programs):
    with pytest.raises(ReplayGapError) as caught:
        plan_replay("net/from_raw", T10, T10 + HOUR, programs, {})
    assert str(caught.value) == "no archive of net/raw covers 2026-11-20T10:00Z..11:00Z (it is not archived)"


def test_a_gap_across_midnight_keeps_both_dates(programs):
    with pytest.raises(ReplayGapError) as caught:
        plan_replay("net/traffic", at("23:00"), at("23:00") + 2 * HOUR, programs, {})
    assert str(caught.value) == "no archive of net/traffic covers 2026-11-20T23:00Z..2026-11-21T01:00Z"


def test_an_unknown_target_is_named_with_close_names(programs):
    with pytest.raises(ReplayPlanError) as caught:
        plan_replay("net/trafic", T10, T10 + HOUR, programs, {})
    assert str(caught.value) == "unknown function net/trafic (did you mean net/traffic?)"
    with pytest.raises(ReplayPlanError) as caught:
        plan_replay("top", T10, T10 + HOUR, programs, {})
    assert str(caught.value) == "unknown function top (did you mean net/top?)"
    with pytest.raises(ReplayPlanError) as caught:
        plan_replay("zzz/qqq", T10, T10 + HOUR, programs, {})
    assert str(caught.value) == "unknown function zzz/qqq"


@pytest.mark.parametrize("since, until", [(T10, T10), (T10 + HOUR, T10)])
def test_since_not_before_until_is_refused(programs, since, until):
    with pytest.raises(ReplayPlanError) as caught:
        plan_replay("net/traffic", since, until, programs, {"net/traffic": full()})
    assert str(caught.value) == (f"--since {format_time(since)} is not before --until {format_time(until)}")
    assert str(caught.value).startswith("--since 2026-11-20T1")


def test_functions_of_other_programs_are_planned_through(programs):
    reports = loads(program_text("reports", {"hourly": (["net/left"], False)}), "reports.toml", programs)
    plan = plan_replay("reports/hourly", T10, T10 + HOUR, {**programs, "reports": reports}, {"net/traffic": full()})
    assert plan.sources == ("net/traffic",)
    assert plan.links == (("net/left", "reports/hourly"), ("net/traffic", "net/left"))


def test_holes_are_the_uncovered_parts_in_order():
    assert holes(0, 100, [Interval(10, 20), Interval(15, 30), Interval(50, 200)]) == [(0, 10), (30, 50)]
    assert holes(0, 100, []) == [(0, 100)]
    assert holes(0, 100, [Interval(0, 100)]) == []


# -- lenient plans: what the archives cover of the range -------------------------------------------

def lenient(programs, target, coverage):
    return plan_replay(target, T10, T10 + HOUR, programs, coverage, strict=False)


@pytest.mark.parametrize("coverage, since, until, uncovered", [
    (full("10:20", "12:00"), "10:20", "11:00", [("10:00", "10:20")]),
    (full("09:00", "10:45"), "10:00", "10:45", [("10:45", "11:00")]),
    (full("10:20", "10:40"), "10:20", "10:40", [("10:00", "10:20"), ("10:40", "11:00")]),
    ([Interval(at("09:00"), at("10:15")), Interval(at("10:30"), at("12:00"))], "10:00", "11:00",
     [("10:15", "10:30")]),
], ids=["start-missing", "end-missing", "both-ends-missing", "hole-inside"])
def test_a_lenient_plan_keeps_what_is_covered_and_names_what_is_not(programs, coverage, since, until, uncovered):
    plan = lenient(programs, "net/top", {"net/traffic": coverage})
    assert (plan.since_us, plan.until_us) == (at(since), at(until))
    assert plan.uncovered == tuple(("net/traffic", at(a), at(b)) for a, b in uncovered)
    assert plan.sources == ("net/traffic",) and "net/top" in plan.functions
    assert ReplayPlan.from_json(plan.to_json()) == plan


def test_a_lenient_plan_shrinks_to_what_every_source_covers(programs):
    plan = lenient(programs, "net/mixed", {"net/traffic": full("10:20", "12:00"), "net/dns": full("09:00", "10:40")})
    assert (plan.since_us, plan.until_us) == (at("10:20"), at("10:40"))
    assert plan.uncovered == (("net/traffic", at("10:00"), at("10:20")), ("net/dns", at("10:40"), at("11:00")))
    assert uncovered_warning(plan) == ("no archive covers 2026-11-20T10:00Z..10:20Z (net/traffic), "
                                       "2026-11-20T10:40Z..11:00Z (net/dns): replaying 2026-11-20T10:20Z..10:40Z")


def test_a_lenient_plan_of_a_covered_range_is_the_strict_one(programs):
    coverage = {"net/traffic": full()}
    plan = lenient(programs, "net/top", coverage)
    assert plan == plan_replay("net/top", T10, T10 + HOUR, programs, coverage) and uncovered_warning(plan) is None


@pytest.mark.parametrize("coverage", [
    {"net/traffic": full("08:00", "09:30")},
    {"net/traffic": [], "net/dns": full()},
    {"net/traffic": full("10:00", "10:20"), "net/dns": full("10:40", "11:00")},  # nothing in common
], ids=["all-before", "one-source-empty", "disjoint-sources"])
def test_a_lenient_plan_with_nothing_covered_is_the_strict_error(programs, coverage):
    with pytest.raises(ReplayGapError) as strict:
        plan_replay("net/mixed", T10, T10 + HOUR, programs, coverage)
    with pytest.raises(ReplayGapError) as lenient_error:
        lenient(programs, "net/mixed", coverage)
    assert str(lenient_error.value) == str(strict.value)


def test_a_lenient_plan_uses_a_partly_covering_own_archive_when_its_ancestors_cover_nothing(programs):
    """A function archived on its site, fed live from a source archived nowhere (`ramen tail -n`
    of it looks back past its archive's start): its own archive answers what it holds."""
    coverage = {"net/top": full("10:30", "12:00"), "net/traffic": full("08:00", "09:00")}
    plan = lenient(programs, "net/top", coverage)
    assert (plan.since_us, plan.until_us) == (at("10:30"), at("11:00"))
    assert plan.sources == ("net/top",) and plan.links == () and plan.functions == ("net/top",)
    assert plan.uncovered == (("net/top", at("10:00"), at("10:30")),)
    with pytest.raises(ReplayGapError, match="net/traffic"):  # strict: the gap its ancestors leave
        plan_replay("net/top", T10, T10 + HOUR, programs, coverage)
    # Ancestors that cover some of the range are preferred, as in a strict plan.
    plan = lenient(programs, "net/top", {"net/top": full("10:30", "12:00"), "net/traffic": full("10:20", "12:00")})
    assert plan.sources == ("net/traffic",) and plan.since_us == at("10:20")
