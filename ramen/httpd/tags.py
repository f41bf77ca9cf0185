"""The tags of ramen's series, for Graphite's tag queries (`seriesByTag`, `/tags`, Grafana's tag
editor): the series of field `f` of function `p/fn` has the tag `name` = `p.fn.f` and one tag per
factor, the factor's value, and is named in Graphite's tagged form, its tags but `name` sorted:
`p.fn.f;host=h1`. Path mode names the same series `p.fn.h1.f`.

Expressions follow graphite-web's tag database: `tag=value`, `tag!=value`, `tag=~regex`,
`tag!=~regex` (a regex anchored at the value's start); a series without a tag has it empty, and
at least one expression of a query must need a value. A factor value Graphite cannot write as a
tag's (empty, holding `;`, starting with `~`) is no tag: the series is as if it had none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ramen.httpd.regexes import RegexError, UserRegex

NAME_TAG = "name"
_EXPRESSION = re.compile(r"^([^;!=]+)(!?=~?)([^;]*)$")
_TAG_FORBIDDEN = set(";!^=")


class TagError(ValueError):
    """A tag expression that cannot be read; the message is one line for the user."""


def is_tag(tag: str) -> bool:
    """Whether Graphite can write `tag` as a tag's name."""
    return bool(tag) and not _TAG_FORBIDDEN.intersection(tag)


def is_value(value: str) -> bool:
    """Whether Graphite can write `value` as a tag's value."""
    return bool(value) and ";" not in value and not value.startswith("~")


def tags_of(name: str, factors: Iterable[str], values: Iterable[str]) -> dict[str, str]:
    """The tags of the series `name` (`<program>.<function>.<field>`) of these factor values."""
    return {NAME_TAG: name, **{f: v for f, v in zip(factors, values) if f != NAME_TAG and is_tag(f) and is_value(v)}}


def tagged_name(tags: Mapping[str, str]) -> str:
    """Graphite's name of a tagged series: `name;a=1;b=2`, its other tags sorted."""
    return tags.get(NAME_TAG, "") + "".join(sorted(f";{tag}={value}" for tag, value in tags.items() if tag != NAME_TAG))


def parse_tagged(name: str) -> dict[str, str]:
    """The tags a tagged name (`name;a=1`) spells; a segment that is no `tag=value` is left out."""
    metric, *segments = name.split(";")
    tags = dict(segment.split("=", 1) for segment in segments if "=" in segment and segment[0] != "=")
    return {**tags, NAME_TAG: metric}


@dataclass(frozen=True)
class TagExpression:
    """One condition on one tag's value (empty where the series has no such tag)."""
    tag: str
    operator: str
    """`=`, `!=`, `=~` or `!=~`."""
    value: str
    regex: UserRegex | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, text: str) -> TagExpression:
        found = _EXPRESSION.match(text)
        if found is None or found.group(2) not in ("=", "!=", "=~", "!=~"):
            raise TagError(f"bad tag expression {text!r}: expected tag=value, tag!=value, tag=~regex or tag!=~regex")
        tag, operator, value = found.groups()
        regex = None
        if operator.endswith("~"):
            try:
                regex = UserRegex(value, f"tag expression {text!r}")
            except RegexError as e:
                raise TagError(f"bad {e}") from None
        return cls(tag, operator, value, regex)

    def matches(self, value: str) -> bool:
        if self.regex is not None:
            return self.regex.match(value) == (self.operator == "=~")
        return (value == self.value) == (self.operator == "=")

    @property
    def text(self) -> str:
        return f"{self.tag}{self.operator}{self.value}"


class TagQuery(str):
    """The expressions of a `seriesByTag` call, as the path expression its series come from: a
    str, the call as written (graphite-web's; a graphite-web federating ramen files the series it
    gets by it) or else as Grafana's editor writes it (`seriesByTag('name=a.b', 'host=~h1')`), so
    that it keys a render's fetches beside path expressions and names what functions make of them."""

    expressions: tuple[TagExpression, ...]

    def __new__(cls, texts: Sequence[str], written: str = "") -> TagQuery:
        if not texts:
            raise TagError("a tag query needs at least one expression, such as 'name=prog.func.field'")
        expressions = tuple(TagExpression.parse(text) for text in texts)
        if all(e.matches("") for e in expressions):
            raise TagError(f"no expression of {', '.join(map(repr, texts))} needs a value: at least one must "
                           "(such as 'name=prog.func.field')")
        quoted = (f'"{e.text}"' if "'" in e.text else f"'{e.text}'" for e in expressions)
        query = super().__new__(cls, written or f"seriesByTag({', '.join(quoted)})")
        query.expressions = expressions
        return query

    def matches(self, tags: Mapping[str, str]) -> bool:
        """Whether a series of these tags is one the query names."""
        return all(e.matches(tags.get(e.tag, "")) for e in self.expressions)

    def may_match(self, tags: Mapping[str, str], unknown: Iterable[str]) -> bool:
        """Whether a series of these tags, and of tags `unknown` whose values are not known yet,
        may be one the query names."""
        unknown = set(unknown)
        return all(e.matches(tags.get(e.tag, "")) for e in self.expressions if e.tag not in unknown)
