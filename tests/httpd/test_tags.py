"""Tags of ramen's series as Graphite's tag database has them: the expressions' semantics,
tagged names, and the tree's series named by tag queries."""

import pytest

from ramen.httpd.names import Metric
from ramen.httpd.tags import TagError, TagExpression, TagQuery, parse_tagged, tagged_name, tags_of
from tests.httpd.test_names import tree  # noqa: F401 - the fixture: net's tree, hosts a, b and 10.0.0.1


@pytest.mark.parametrize("expression, matching, not_matching", [
    ("host=a", ["a"], ["ab", "", "A"]),
    ("host!=a", ["ab", ""], ["a"]),
    ("host=~a", ["a", "ab"], ["ba", ""]),  # anchored at the start, not at the end
    ("host=~^(a|b)$", ["a", "b"], ["ab", ""]),
    ("host!=~a", ["ba", ""], ["a", "ab"]),
    ("host=", [""], ["a"]),  # a series without the tag has it empty
    ("host!=", ["a"], [""]),
])
def test_expressions_are_graphite_webs_regexes_anchored_at_the_start(expression, matching, not_matching):
    parsed = TagExpression.parse(expression)
    assert [parsed.matches(v) for v in matching] == [True] * len(matching)
    assert [parsed.matches(v) for v in not_matching] == [False] * len(not_matching)


@pytest.mark.parametrize("expressions, message", [
    ([], "at least one expression"),
    (["host"], "bad tag expression 'host': expected tag=value"),
    (["=a"], "bad tag expression '=a'"),
    (["host=a;b"], "bad tag expression 'host=a;b'"),
    (["host=~("], "bad tag expression 'host=~(': bad regular expression"),
    (["host!=a", "dc="], "no expression of 'host!=a', 'dc=' needs a value"),
])
def test_bad_queries_are_one_line_errors(expressions, message):
    with pytest.raises(TagError, match=message.replace("(", r"\(")):
        TagQuery(expressions)


def test_a_query_is_the_path_expression_grafana_writes_and_names_series_as_graphite_does():
    query = TagQuery(["name=net.traffic.bytes", "host=~a|b", "note!=it's"])
    assert query == "seriesByTag('name=net.traffic.bytes', 'host=~a|b', \"note!=it's\")"
    assert {query: 1}["seriesByTag('name=net.traffic.bytes', 'host=~a|b', \"note!=it's\")"] == 1
    tags = {"name": "net.traffic.bytes", "host": "a", "dc": "west"}
    assert tagged_name(tags) == "net.traffic.bytes;dc=west;host=a"
    assert parse_tagged("net.traffic.bytes;dc=west;host=a") == tags
    assert parse_tagged("sum;host=") == {"name": "sum", "host": ""}
    # values Graphite cannot write as a tag's are no tags
    assert tags_of("p.f.x", ["host", "dc", "zone", "name"], ["a", "", "~z", "n"]) == {"name": "p.f.x", "host": "a"}


def test_the_tree_names_series_by_tags_its_functions_and_factor_values_have(tree):
    everything = tree.tagged()
    assert [tagged_name(tags) for tags, *_ in everything] == [
        "net.total.bytes", "net.traffic.bytes;host=10.0.0.1", "net.traffic.bytes;host=a",
        "net.traffic.bytes;host=b", "net.traffic.ratio;host=10.0.0.1", "net.traffic.ratio;host=a",
        "net.traffic.ratio;host=b"]
    query = TagQuery(["name=~net\\.traffic\\.", "host!=~[ab]"])
    assert tree.expand(query) == [
        Metric("net.traffic.bytes;host=10.0.0.1", "net/traffic", ("10.0.0.1",), "bytes",
               (("host", "10.0.0.1"), ("name", "net.traffic.bytes"))),
        Metric("net.traffic.ratio;host=10.0.0.1", "net/traffic", ("10.0.0.1",), "ratio",
               (("host", "10.0.0.1"), ("name", "net.traffic.ratio")))]
    assert [f.qualified_name for f in tree.functions_matching(query)] == ["net/traffic"]


def test_factor_values_are_asked_only_of_functions_a_query_may_name(tree):
    assert [m.path for m in tree.expand(TagQuery(["name=net.total.bytes"]))] == ["net.total.bytes"]
    assert tree.asked == []  # net.total has no factor; net.traffic's names do not match
    assert tree.expand(TagQuery(["dc=west"])) == []  # no function has a dc
    assert tree.asked == []
    assert [m.path for m in tree.expand(TagQuery(["host=b", "name=~net.traffic.b"]))] == ["net.traffic.bytes;host=b"]
    assert tree.asked == ["net/traffic"]
