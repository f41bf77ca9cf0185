"""The regular expressions requests bring are matched within a time bound (ramen/httpd/regexes.py):
one that backtracks without end is a one-line error, not a render that holds httpd for hours."""

from __future__ import annotations

import pytest

from ramen.httpd.regexes import RegexError, UserRegex
from ramen.httpd.tags import TagExpression
from ramen.httpd.target import TargetError
from tests.httpd.test_functions import run, series

ZEROS = "0" * 64
"""(0|00)+X tries every way to split a run of zeros into ones and twos before it fails: about
10^13 ways for these, hours of matching."""
BACKTRACKING = "(0|00)+X"


def test_an_expression_is_matched_searched_and_substituted_as_re_would():
    host = UserRegex(r"host(\d+)", "aliasSub")
    assert host.search("net.host07.bytes") and not host.match("net.host07.bytes") and host.match("host07")
    assert host.sub(r"h\1", "net.host07.bytes") == "net.h07.bytes"
    assert not UserRegex(BACKTRACKING, "grep").search("net.host07.bytes")  # quick where there is no long run


@pytest.mark.parametrize("call, message", [
    (lambda: UserRegex("(", "grep"), "grep: bad regular expression '(': missing )"),
    (lambda: UserRegex("host", "aliasSub").sub(r"\2", "host"), r"aliasSub: bad replacement '\\2': invalid group"),
])
def test_bad_expressions_and_replacements_are_one_line_errors_naming_who_was_given_them(call, message):
    with pytest.raises(RegexError) as raised:
        call()
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_an_expression_that_backtracks_without_end_is_refused_in_one_line():
    with pytest.raises(RegexError, match=r"^grep: regular expression '\(0\|00\)\+X' took over 0.1 s on 'h0+': it "
                                         r"backtracks without end"):
        UserRegex(BACKTRACKING, "grep").search(f"h{ZEROS}")


@pytest.mark.parametrize("target", [f"grep(p.f.*.x, '{BACKTRACKING}')", f"exclude(p.f.*.x, '{BACKTRACKING}')",
                                    f"aliasSub(p.f.*.x, '{BACKTRACKING}', 'y')",
                                    f"useSeriesAbove(p.f.*.x, 0, '{BACKTRACKING}', 'y')"])
def test_the_functions_given_expressions_match_them_within_the_bound(target):
    with pytest.raises((RegexError, TargetError), match=r"^\w+: regular expression .* backtracks without end"):
        run(target, {"p.f.*.x": [series(f"p.f.h{ZEROS}.x", [1.0, 2.0])]})


def test_a_tag_expression_matches_within_the_bound():
    expression = TagExpression.parse(f"host=~{BACKTRACKING}")
    assert not expression.matches("host07")
    with pytest.raises(RegexError, match="backtracks without end"):
        expression.matches(ZEROS)
