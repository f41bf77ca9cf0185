"""is_used on hand-built graphs: live chains, diamonds, replays sharing ancestors, replays ending."""

from __future__ import annotations

from choreographer.graph import build_graph, compute_usage
from tests.choreographer.programs import program

# a (source, live) → b, c (lazy) → d (lazy): a diamond
DIAMOND = [("a", False, []), ("b", True, ["net/a"]), ("c", True, ["net/a"]), ("d", True, ["net/b", "net/c"])]


def used(usage) -> set[str]:
    return {name for name, u in usage.items() if u.is_used}


def test_lazy_functions_nobody_needs_are_unused():
    graph = build_graph([program("net", DIAMOND)])
    assert used(compute_usage(graph, {})) == {"net/a"}


def test_a_non_lazy_function_makes_all_its_ancestors_used():
    graph = build_graph([program("net", [*DIAMOND, ("e", False, ["net/d"])])])
    assert used(compute_usage(graph, {})) == {"net/a", "net/b", "net/c", "net/d", "net/e"}


def test_a_tail_marks_its_target_and_ancestors_live():
    graph = build_graph([program("net", DIAMOND)])
    usage = compute_usage(graph, {}, tail_targets=["net/b"])
    assert used(usage) == {"net/a", "net/b"}
    assert usage["net/b"].live and not usage["net/c"].is_used


def test_a_replay_marks_only_the_functions_on_its_paths():
    graph = build_graph([program("net", DIAMOND)])
    # d replayed from b's archive and from a's through c: its plan's functions
    usage = compute_usage(graph, {7: ["net/b", "net/c", "net/a", "net/d"]})
    assert used(usage) == {"net/a", "net/b", "net/c", "net/d"}
    assert usage["net/d"].replays == {7} and not usage["net/d"].live
    usage = compute_usage(graph, {7: ["net/b", "net/d"]})  # b's archive covers: a, c not needed
    assert used(usage) == {"net/a", "net/b", "net/d"}  # a is live anyway
    assert not usage["net/c"].is_used


def test_replays_sharing_ancestors_and_one_ending_while_the_other_runs():
    lazy_top = [("a", True, []), ("b", True, ["net/a"]), ("c", True, ["net/b"]), ("d", True, ["net/b"])]
    graph = build_graph([program("net", lazy_top)])
    both = compute_usage(graph, {1: ["net/a", "net/b", "net/c"], 2: ["net/a", "net/b", "net/d"]})
    assert used(both) == {"net/a", "net/b", "net/c", "net/d"}
    assert both["net/b"].replays == {1, 2}
    after_1_ends = compute_usage(graph, {2: ["net/a", "net/b", "net/d"]})
    assert used(after_1_ends) == {"net/a", "net/b", "net/d"}
    assert after_1_ends["net/b"].replays == {2}
    assert used(compute_usage(graph, {})) == set()


def test_functions_of_other_programs_are_one_graph():
    net = program("net", [("a", False, []), ("b", True, ["net/a"])])
    report = program("report", [("r", False, ["net/b"])], loaded={"net": net})
    graph = build_graph([net, report])
    assert used(compute_usage(graph, {})) == {"net/a", "net/b", "report/r"}


def test_a_replay_naming_unknown_functions_is_ignored_for_those():
    graph = build_graph([program("net", DIAMOND)])
    assert used(compute_usage(graph, {3: ["gone/x", "net/b"]})) == {"net/a", "net/b"}
