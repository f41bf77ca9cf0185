"""Graphite's target grammar: what a `/render?target=` says, as a small tree the evaluator walks.

A target is a path expression (`prog.func.*.field`, globs at any level), or a call of a function
whose arguments are targets, strings in either quote, numbers, booleans, `None`, `inf`, and keyword
arguments (`f(a.b, 2, key=value)`); graphite-web's pipes (`a.b|scale(2)`, the same as
`scale(a.b, 2)`) read too. The facts follow graphite-web's render/grammar.py: a number is only a
number when a `,` or `)` follows it (so `1h` or `2xx` is a path), a backslash escapes one of
`(){},.'"\\|=` inside a path, a string is what its quotes hold, as written (a backslash and the
character after it both stay, so a regular expression's `\\d` or `\\1` reaches aliasSub; an escaped
or doubled quote does not end it), and whitespace may separate tokens but not split a path.

ramen.httpd.functions.fetches lists every path a target needs, so the caller resolves and fetches
them all at once (a dashboard's refresh is then one replay per function, not one per reference).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace

__all__ = ["Call", "Literal", "Node", "PathExpr", "TargetError", "parse"]

PATH_SYMBOLS = "(){},.'\"\\|"
"""Characters a path element may not hold unescaped (graphite-web's `symbols`)."""
ESCAPABLE = PATH_SYMBOLS + "="
QUOTES = "'\""
DELIMITERS = ",)"
"""What may follow a number or a keyword literal for it to be one (graphite-web's lookahead)."""
MAX_DEPTH = 64
"""Calls nested in a target, pipes included: a dashboard's deepest are a few levels; a bound keeps
the parser's and evaluator's recursion far from the interpreter's limit."""
MAX_INTEGER_DIGITS = 18
"""An integer literal with more digits is read as a float (its value, or inf): any integer a
function takes is far smaller, and Python refuses to read one of over 4,300 digits."""
KEYWORDS = {"true": True, "false": False, "none": None, "inf": float("inf")}
"""Literals graphite-web reads whatever their case (`True`, `NONE`)."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"-?\d+(?P<fraction>\.\d+)?(?P<exponent>[eE]-?\d+)?")


class TargetError(ValueError):
    """A target that does not parse or evaluate; the message is one line naming where and what."""


@dataclass(frozen=True)
class PathExpr:
    text: str
    """The path with globs, escapes resolved (as graphite-web's pathExpression)."""


@dataclass(frozen=True)
class Literal:
    value: str | int | float | bool | None


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Node, ...] = ()
    kwargs: tuple[tuple[str, Node], ...] = ()
    """(name, value) pairs in the order written: a tuple so a Call stays hashable (a cache key)."""
    text: str = field(default="", compare=False)
    """The call as written in the target ('' for one a pipe made): graphite-web's `raw`, which
    seriesByTag's series carry as their path expression."""


Node = PathExpr | Literal | Call


def parse(text: str, functions: Collection[str]) -> Node:
    """The tree of one target; TargetError names the column and what was expected there.

    A call of a function not in `functions` (ramen.httpd.functions.FUNCTIONS, which builds on this
    module) is refused here, so a typo is a 400 before any replay runs.
    """
    return _Parser(text, functions).target()


def _depth(node: Node) -> int:
    """Levels of calls in `node` (a path or literal: 0), without recursion."""
    deepest, stack = 0, [(node, 0)]
    while stack:
        current, level = stack.pop()
        if isinstance(current, Call):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in (*current.args, *(value for _, value in current.kwargs)))
    return deepest


class _Parser:
    """Recursive descent over the target text; `pos` is the index of the next unread character."""

    def __init__(self, text: str, functions: Collection[str]) -> None:
        self.text = text
        self.functions = functions
        self.pos = 0
        self.nesting = 0
        """Calls open around pos: the parser recurses once a level."""

    def target(self) -> Node:
        if not self.text.strip():
            raise TargetError("empty target")
        node = self.expression()
        self.skip_space()
        if self.pos < len(self.text):
            self.fail("end of target")
        if _depth(node) > MAX_DEPTH:  # pipes nest without the parser recursing
            self.too_deep()
        return node

    # Errors

    def fail(self, expected: str, at: int | None = None) -> None:
        at = self.pos if at is None else at
        found = repr(self.text[at]) if at < len(self.text) else "end of target"
        raise TargetError(f"target {self.text!r}: column {at + 1}: expected {expected}, found {found}")

    def too_deep(self) -> None:
        raise TargetError(f"target {self.text[:80]!r}{'...' if len(self.text) > 80 else ''}: calls nested more "
                          f"than {MAX_DEPTH} deep")

    # Lexical helpers

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def followed_by_delimiter(self, at: int) -> bool:
        """Whether only spaces lie between `at` and a `,`, a `)` or the end."""
        while at < len(self.text) and self.text[at].isspace():
            at += 1
        return at == len(self.text) or self.text[at] in DELIMITERS

    def call_name_here(self) -> re.Match | None:
        """The identifier at pos if a `(` follows it (spaces allowed between, as in graphite-web)."""
        name = _IDENT.match(self.text, self.pos)
        if name is None:
            return None
        after = name.end()
        while after < len(self.text) and self.text[after].isspace():
            after += 1
        return name if after < len(self.text) and self.text[after] == "(" else None

    # Grammar

    def expression(self) -> Node:
        self.skip_space()
        node = self.call() if self.call_name_here() else self.path()
        self.skip_space()
        while self.peek() == "|":  # a pipe passes what is left of it as the first argument
            self.pos += 1
            self.skip_space()
            if not self.call_name_here():
                self.fail("a function call after '|'")
            piped = self.call()
            node = Call(piped.name, (node, *piped.args), piped.kwargs)
            self.skip_space()
        return node

    def call(self) -> Call:
        start = self.pos
        name = self.call_name_here()
        assert name is not None
        if name.group() not in self.functions:
            raise TargetError(f"target {self.text!r}: column {start + 1}: unknown function {name.group()!r}")
        self.pos = name.end()
        self.skip_space()
        self.pos += 1  # the "(" call_name_here saw
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            self.too_deep()
        call = self.arguments(name.group())
        self.nesting -= 1
        return replace(call, text=self.text[start:self.pos])

    def arguments(self, name: str) -> Call:
        """What follows a call's "(": its arguments, through the ")"."""
        args: list[Node] = []
        kwargs: list[tuple[str, Node]] = []
        self.skip_space()
        if self.peek() == ")":
            self.pos += 1
            return Call(name, (), ())
        while True:
            self.skip_space()
            keyword = self.keyword_here()
            if keyword is not None:
                if any(existing == keyword for existing, _value in kwargs):
                    raise TargetError(f"target {self.text!r}: column {self.pos + 1}: "
                                      f"keyword argument {keyword!r} given twice")
                self.pos = self.text.index("=", self.pos) + 1
                kwargs.append((keyword, self.argument()))
            elif kwargs:
                self.fail("a keyword argument (name=value) after a keyword argument")
            else:
                args.append(self.argument())
            self.skip_space()
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() == ")":
                self.pos += 1
                return Call(name, tuple(args), tuple(kwargs))
            else:
                self.fail("',' or ')'")

    def keyword_here(self) -> str | None:
        """The name of a keyword argument starting at pos (`name =`), or None."""
        name = _IDENT.match(self.text, self.pos)
        if name is None:
            return None
        after = name.end()
        while after < len(self.text) and self.text[after].isspace():
            after += 1
        return name.group() if after < len(self.text) and self.text[after] == "=" else None

    def argument(self) -> Node:
        self.skip_space()
        char = self.peek()
        if char in QUOTES and char:
            return self.string()
        number = _NUMBER.match(self.text, self.pos)
        if number and self.followed_by_delimiter(number.end()):
            self.pos = number.end()
            if (number.group("fraction") is None and number.group("exponent") is None
                    and len(number.group().lstrip("-")) <= MAX_INTEGER_DIGITS):
                return Literal(int(number.group()))
            return Literal(float(number.group()))
        word = _IDENT.match(self.text, self.pos)
        if word and word.group().lower() in KEYWORDS and self.followed_by_delimiter(word.end()):
            self.pos = word.end()
            return Literal(KEYWORDS[word.group().lower()])
        if not char or char in DELIMITERS:
            self.fail("an argument")
        return self.expression()

    def string(self) -> Literal:
        """A quoted string, as graphite-web reads one: the text between its quotes, backslashes
        included; a quote after a backslash, or doubled, does not end it."""
        quote = self.peek()
        start = self.pos
        self.pos += 1
        chars: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if (char == "\\" and self.pos + 1 < len(self.text)) or self.text.startswith(quote * 2, self.pos):
                chars.append(self.text[self.pos:self.pos + 2])
                self.pos += 2
            elif char == quote:
                self.pos += 1
                return Literal("".join(chars))
            elif char in "\r\n":
                break
            else:
                chars.append(char)
                self.pos += 1
        raise TargetError(f"target {self.text!r}: column {start + 1}: unterminated string "
                          f"(expected a closing {quote})")

    def path(self) -> PathExpr:
        """Dot-separated elements; each is plain characters, escapes and `{a,b}` enumerations, or
        a double-quoted name (ramen's factor values that hold dots: `net.traffic."10.0.0.1".bytes`)."""
        text: list[str] = []
        while True:
            element_start = self.pos
            if self.pos > 0 and self.peek() == '"':
                text.append(self.quoted_element())
            while self.pos < len(self.text):
                char = self.text[self.pos]
                if char == "\\":
                    if self.pos + 1 < len(self.text) and self.text[self.pos + 1] in ESCAPABLE:
                        text.append(self.text[self.pos + 1])
                        self.pos += 2
                        continue
                    self.fail(f"one of {ESCAPABLE} after '\\'", self.pos + 1)
                if char == "{":
                    text.append(self.enumeration())
                    continue
                if char.isspace() or char in PATH_SYMBOLS:
                    break
                text.append(char)
                self.pos += 1
            if self.pos == element_start:
                self.fail("a metric path or a function call" if not text else "a path element")
            if self.peek() != ".":
                return PathExpr("".join(text))
            text.append(".")
            self.pos += 1

    def quoted_element(self) -> str:
        """A path element in double quotes, inner quotes doubled, kept as written (ramen.httpd.names
        reads it as one literal name)."""
        start = self.pos
        end = start + 1
        while end < len(self.text):
            if self.text[end] == '"':
                if self.text[end + 1:end + 2] == '"':
                    end += 2
                    continue
                self.pos = end + 1
                return self.text[start:self.pos]
            end += 1
        raise TargetError(f"target {self.text!r}: column {start + 1}: unterminated quoted name (expected a closing \")")

    def enumeration(self) -> str:
        """`{a,b}` inside a path element, kept as written (the glob matcher reads it)."""
        start = self.pos
        self.pos += 1
        parts: list[str] = []
        current: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] in ESCAPABLE:
                current.append(self.text[self.pos + 1])
                self.pos += 2
            elif char in ",}":
                if not current:
                    self.fail("a value inside '{...}'")
                parts.append("".join(current))
                current = []
                self.pos += 1
                if char == "}":
                    return "{" + ",".join(parts) + "}"
            elif char.isspace() or char in PATH_SYMBOLS:
                break
            else:
                current.append(char)
                self.pos += 1
        raise TargetError(f"target {self.text!r}: column {start + 1}: unclosed '{{' (expected '}}')")
