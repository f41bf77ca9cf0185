"""The target parser on what Grafana sends and on what a user gets wrong."""

import pytest

from ramen.httpd.functions import FUNCTIONS, Context, fetches
from ramen.httpd.target import MAX_DEPTH, Call, Literal, PathExpr, TargetError, parse
from tests.httpd.graphite_web import graphite_modules

KNOWN = {"sumSeries", "scale", "alias", "summarize", "f", "g", "keepLastValue"}


def path_expressions(node):
    """The paths a render fetches for the target, in the order written."""
    return [path for path, _, _ in fetches(node, Context(from_s=0, until_s=60, now_s=60))]


def test_plain_path_with_globs_at_any_level_is_one_path_expression():
    for text in ("a.*.c", "a.{x,y}.b", "a.b[0-9].c", "a.b*", "*.*", "net.per_minute.host-1.bytes", "a.b?c:d"):
        assert parse(text, KNOWN) == PathExpr(text)


def test_nested_calls_strings_numbers_booleans_and_keywords():
    node = parse("""f(a.b, g(c.*), "s", 'q', 1.5, -2, true, key=value.x)""", KNOWN)
    assert node == Call("f", (PathExpr("a.b"), Call("g", (PathExpr("c.*"),)), Literal("s"), Literal("q"),
                              Literal(1.5), Literal(-2), Literal(True)), (("key", PathExpr("value.x")),))


def test_number_forms_and_their_types():
    node = parse("f(1, -2, 1.5, -0.25, 1e3, 2.5E-2, -3e2)", KNOWN)
    values = [arg.value for arg in node.args]
    assert values == [1, -2, 1.5, -0.25, 1000.0, 0.025, -300.0]
    assert [type(v) for v in values] == [int, int, float, float, float, float, float]


def test_an_integer_of_more_digits_than_any_function_takes_is_read_as_a_float():
    """Python refuses to read an integer of over 4,300 digits (a 500, before)."""
    node = parse(f"f(-{'9' * 19}, {'9' * 5000})", KNOWN)
    assert [arg.value for arg in node.args] == [-1e19, float("inf")]


def test_booleans_none_and_inf_read_in_any_case():
    node = parse("f(true, False, TRUE, None, inf)", KNOWN)
    assert [arg.value for arg in node.args] == [True, False, True, None, float("inf")]


def test_a_number_followed_by_letters_is_a_path_as_in_graphite():
    node = parse("f(1h, 2xx.y, 10)", KNOWN)
    assert node.args == (PathExpr("1h"), PathExpr("2xx.y"), Literal(10))


def test_whitespace_between_tokens_is_ignored():
    assert parse(" sumSeries ( a.b ,  scale( c.d , 2 ) ) ", KNOWN) == \
        Call("sumSeries", (PathExpr("a.b"), Call("scale", (PathExpr("c.d"), Literal(2)))))


STRINGS = [r"""alias(a.b, "it's")""", r"alias(a.b, 'it\'s')", r"alias(a.b, 'it''s')", 'alias(a.b, "x,y)z")',
           r"aliasSub(a.b, '^a\.(\w+)$', '\1')", "alias(a.b, '')"]


def test_strings_are_what_their_quotes_hold_as_written():
    assert parse("""alias(a.b, "it's")""", KNOWN).args[1] == Literal("it's")
    assert parse(r"alias(a.b, 'it\'s')", KNOWN).args[1] == Literal(r"it\'s")
    assert parse("alias(a.b, 'it''s')", KNOWN).args[1] == Literal("it''s")
    assert parse('alias(a.b, "x,y)z")', KNOWN).args[1] == Literal("x,y)z")
    assert parse(r"aliasSub(a.b, '^a\.(\w+)$', '\1')", KNOWN | {"aliasSub"}).args[1:] == \
        (Literal(r"^a\.(\w+)$"), Literal(r"\1"))


@pytest.mark.parametrize("text", STRINGS)
def test_same_strings_as_graphite_webs_grammar(text):
    grammar, = graphite_modules("graphite.render.grammar")
    theirs = [a.string[1:-1] for a in grammar.grammar.parseString(text).expression.call.args if a.string]
    assert [a.value for a in parse(text, KNOWN | {"aliasSub"}).args[1:]] == theirs


def test_backslash_escapes_a_symbol_in_a_path():
    assert parse(r"f(a\(1\).b\,c)", KNOWN).args == (PathExpr("a(1).b,c"),)


def test_pipe_passes_the_left_side_as_first_argument():
    assert parse("a.*.b | scale(2) | alias('x')", KNOWN) == \
        parse("alias(scale(a.*.b, 2), 'x')", KNOWN)


def test_call_without_arguments():
    assert parse("f()", KNOWN) == Call("f")


def test_path_expressions_lists_every_path_once_in_order():
    node = parse("sumSeries(a.*.b, scale(c.{x,y}, 2), a.*.b, g(d, key=e.f))", KNOWN)
    assert path_expressions(node) == ["a.*.b", "c.{x,y}", "d", "e.f"]
    assert path_expressions(parse("a.b", KNOWN)) == ["a.b"]


def test_nodes_are_hashable_so_targets_can_key_a_cache():
    assert len({parse("scale(a.b, 2, key=c)", KNOWN), parse("scale(a.b,2,key=c)", KNOWN)}) == 1


def test_default_function_table_is_the_evaluators():
    assert parse("perSecond(a.b)", FUNCTIONS) == Call("perSecond", (PathExpr("a.b"),))


@pytest.mark.parametrize("text, message", [
    ("", "empty target"),
    ("   ", "empty target"),
    ("sumSeries(a.b", "column 14: expected ',' or ')', found end of target"),
    ("sumSeries(a.b))", "column 15: expected end of target, found ')'"),
    ("sumSeries(a.b,)", "column 15: expected an argument, found ')'"),
    ("alias(a.b, 'x)", "column 12: unterminated string (expected a closing ')"),
    ('alias(a.b, "x)', 'column 12: unterminated string (expected a closing ")'),
    ("nosuch(a.b)", "column 1: unknown function 'nosuch'"),
    ("scale(nosuch(a.b), 2)", "column 7: unknown function 'nosuch'"),
    ("a..b", "column 3: expected a path element, found '.'"),
    ("a.b.", "column 5: expected a path element, found end of target"),
    ("a.{x,y.b", "column 3: unclosed '{' (expected '}')"),
    ("f(key=a, b)", "column 10: expected a keyword argument (name=value) after a keyword argument"),
    ("f(k=a, k=b)", "keyword argument 'k' given twice"),
    ("a.b | c.d", "column 7: expected a function call after '|', found 'c'"),
    ("(a.b)", "column 1: expected a metric path or a function call, found '('"),
])
def test_bad_targets_name_the_column_and_what_was_expected(text, message):
    with pytest.raises(TargetError) as raised:
        parse(text, KNOWN)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 5000])
def test_calls_nested_too_deep_are_refused_as_written_or_piped(levels):
    """Before the parser's or the evaluator's recursion would overflow (an error 500)."""
    for text in ("scale(" * levels + "a.b" + ", 2)" * levels, "a.b" + "|scale(2)" * levels,
                 "scale(" * (levels // 2) + "a.b" + "|scale(2)" * (levels - levels // 2) + ", 2)" * (levels // 2)):
        with pytest.raises(TargetError, match=f"calls nested more than {MAX_DEPTH} deep$"):
            parse(text, KNOWN)
    assert parse("scale(" * (MAX_DEPTH - 1) + "a.b" + "|scale(2)" + ", 2)" * (MAX_DEPTH - 1), KNOWN)


def test_target_error_is_a_value_error_with_the_target_quoted():
    with pytest.raises(ValueError, match=r"^target 'f\(a': column 4: "):
        parse("f(a", KNOWN)


SAME_AS_GRAPHITE = [
    "sumSeries(a.*.b, scale(c.{x,y}, 2), a.*.b, group(d, e.f))",
    "a.b|scale(2)",
    r"f(a\(1\).b\,c)",
    "f(1h, 2xx.y, 10, -2, 1.5e3, 'q.r', \"s.t\", true, None, inf)",
    'alias(a.b, "x,y)z")',
    "a.b[0-9].c",
    "net.per_minute.host-1.{in,out}_bytes",
    " sumSeries ( a.b ,  scale( c.d , 2 ) ) ",
]


@pytest.mark.parametrize("text", SAME_AS_GRAPHITE)
def test_same_path_expressions_as_graphite_webs_grammar(text):
    """graphite-web's own parser (Debian's graphite-web, when importable) finds the same paths."""
    evaluator, = graphite_modules("graphite.render.evaluator")
    assert set(path_expressions(parse(text, KNOWN | {"group"}))) == set(evaluator.extractPathExpressions({}, [text]))


def test_a_quoted_name_is_one_path_element_kept_as_written():
    from ramen.httpd.names import split_path
    node = parse('sumSeries(net.traffic."10.0.0.1".bytes, net.traffic."say ""hi""".bytes)', FUNCTIONS)
    assert path_expressions(node) == ['net.traffic."10.0.0.1".bytes', 'net.traffic."say ""hi""".bytes']
    assert split_path(path_expressions(node)[0]) == ["net", "traffic", '"10.0.0.1"', "bytes"]
    with pytest.raises(TargetError, match="unterminated quoted name"):
        parse('net."10.0', FUNCTIONS)
