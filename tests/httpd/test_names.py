"""The metric tree: programs, functions, factor values and numeric fields as Graphite paths, with
Graphite's globs per level and quoted values."""

import pytest

from ramen.httpd.names import Node, MetricTree, PathError, expand_braces, quote, split_path
from ramen.program import loads

PROGRAM = '''[program]
name = "net"

[[function]]
name = "traffic"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64", ratio = "float64", note = "string" }
event_time = "ts"
factors = ["host"]
archive = { retention = "1d" }

[[function]]
name = "total"
from = ["traffic"]
engine = "spark"
sql = "SELECT ts, bytes FROM traffic"
schema = { ts = "timestamp[us]", bytes = "int64" }
event_time = "ts"

[[function]]
name = "live_only"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
'''
HOSTS = [("a",), ("b",), ("10.0.0.1",)]


@pytest.fixture
def tree():
    asked = []

    def factor_values(function):
        asked.append(function.qualified_name)
        return HOSTS

    tree = MetricTree({"net": loads(PROGRAM)}, factor_values)
    tree.asked = asked
    return tree


def test_levels_are_programs_functions_factor_values_and_numeric_fields(tree):
    assert tree.find("*") == [Node("net", False)]
    # live_only has no archive anywhere on its path: it cannot be replayed, so it is not listed.
    assert tree.find("net.*") == [Node("net.total", False), Node("net.traffic", False)]
    assert tree.find("net.traffic.*") == [Node('net.traffic."10.0.0.1"', False), Node("net.traffic.a", False),
                                          Node("net.traffic.b", False)]
    assert tree.find("net.traffic.a.*") == [Node("net.traffic.a.bytes", True), Node("net.traffic.a.ratio", True)]
    assert tree.find("net.total.*") == [Node("net.total.bytes", True)]


def test_globs_work_at_every_level(tree):
    assert [m.path for m in tree.expand("net.traffic.{a,b}.bytes")] == ["net.traffic.a.bytes", "net.traffic.b.bytes"]
    assert [m.path for m in tree.expand("n?t.t*.[ab].r*")] == ["net.traffic.a.ratio", "net.traffic.b.ratio"]
    assert [m.path for m in tree.expand('net.traffic."10.0.0.1".bytes')] == ['net.traffic."10.0.0.1".bytes']
    metric = tree.expand("net.traffic.*.bytes")[0]
    assert (metric.function, metric.factor_values, metric.field) == ("net/traffic", ("10.0.0.1",), "bytes")
    assert tree.expand("net.traffic.*") == []  # not leaves: a render of it has nothing to draw


def test_factor_values_are_asked_only_for_the_functions_a_pattern_reaches(tree):
    tree.find("net.*")
    tree.find("net.total.*")
    assert tree.asked == []
    # A render's expansion reaches only the functions whose leaves it names: a render fetches no
    # others, so factor values of a branch's function are not there to ask.
    assert [m.path for m in tree.expand("net.*.*")] == ["net.total.bytes"]
    assert tree.expand("net.traffic.*") == []
    assert tree.asked == []
    tree.find("net.traffic.*")
    assert tree.asked == ["net/traffic"]


def test_quoting_and_splitting_round_trip():
    for name in ("plain", "10.0.0.1", 'say "hi"', "a*b", "x,y"):
        assert split_path(f"p.{quote(name)}.f")[1] == quote(name)
    assert split_path('a."b.c".d') == ["a", '"b.c"', "d"]
    with pytest.raises(PathError, match="unbalanced quote"):
        split_path('a."b.c')
    with pytest.raises(PathError, match="empty segment"):
        split_path("a..b")


def test_braces_expand_and_are_bounded():
    assert expand_braces("a{b,c}d{1,2}") == ["abd1", "abd2", "acd1", "acd2"]
    with pytest.raises(PathError, match="more than"):
        expand_braces("{a,b,c,d}" * 6)


def test_a_quoted_value_is_one_name_in_what_find_answers(tree):
    import json

    from ramen.httpd.render import to_find
    hosts = tree.find("net.traffic.*")
    assert [n.name for n in hosts] == ['"10.0.0.1"', "a", "b"]
    answer = json.loads(to_find(hosts, "treejson", query="net.traffic.*"))
    assert [(n["text"], n["id"]) for n in answer][0] == ('"10.0.0.1"', 'net.traffic."10.0.0.1"')


def test_a_tree_over_other_programs_sees_them_not_the_last_ones_walked():
    """Trees over the same programs share one walk of them (replayable's last answer); other
    programs (one loaded, changed or removed) are walked again."""
    before = {"net": loads(PROGRAM)}
    first, again = MetricTree(before, lambda f: HOSTS), MetricTree(before, lambda f: HOSTS)
    assert [f.qualified_name for f in first.functions] == ["net/total", "net/traffic"]
    assert again.functions == first.functions and again.functions is not first.functions
    first.functions.clear()  # a tree's list is its own
    assert [f.qualified_name for f in MetricTree(before, lambda f: HOSTS).functions] == ["net/total", "net/traffic"]
    renamed = {"net": loads(PROGRAM.replace('"total"', '"sum"', 1))}
    assert [f.qualified_name for f in MetricTree(renamed, lambda f: HOSTS).functions] == ["net/sum", "net/traffic"]


WINDOWED = '''[program]
name = "demo"

[[function]]
name = "traffic"
source = { kind = "generator" }
schema = { ts = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "ts"
archive = { retention = "1d" }

[[function]]
name = "per_minute"
from = ["traffic"]
window = { every = "1 minute", lateness = "10s" }
engine = "spark"
sql = "SELECT window_start AS start, host, sum(bytes) AS bytes FROM traffic GROUP BY window_start, host"
schema = { start = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "start"

[[function]]
name = "top_talkers"
from = ["per_minute"]
engine = "spark"
sql = "SELECT * FROM per_minute ORDER BY bytes DESC LIMIT 10"
schema = { start = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "start"

[[function]]
name = "loud"
from = ["top_talkers"]
engine = "spark"
sql = "SELECT * FROM top_talkers WHERE bytes > 1000"
schema = { start = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "start"

[[function]]
name = "mixed"
from = ["traffic", "per_minute"]
engine = "spark"
sql = "SELECT ts AS start, host, bytes FROM traffic"
schema = { start = "timestamp[us]", host = "string", bytes = "int64" }
event_time = "start"
'''


def test_a_function_without_a_window_is_charted_at_the_window_its_parents_share():
    """top_talkers' rows come once per_minute's minute closes: charted at 10 s, 5 of its 6 points
    would be null. It, and what is fed by it alone, is charted at the minute; over parents of
    different windows (or none), at the default step. The programs themselves are untouched."""
    programs = {"demo": loads(WINDOWED)}
    charted = {f.name: f for f in MetricTree(programs, lambda f: []).functions}
    minute = programs["demo"].function("per_minute").window
    assert charted["per_minute"].window == minute
    assert charted["top_talkers"].window == minute and charted["loud"].window == minute
    assert charted["traffic"].window is None and charted["mixed"].window is None
    assert programs["demo"].function("top_talkers").window is None
    assert charted["top_talkers"].qualified_name == "demo/top_talkers"
