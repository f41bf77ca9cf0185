"""Graphite's tag database API (`/tags`, `/tags/<tag>`, `/tags/findSeries`,
`/tags/autoComplete/tags` and `.../values`), as Grafana's tag editor asks it, over ramen's tagged
series (ramen.httpd.tags): the tree's functions and the factor values completion knows (what the
archives hold over their newest hour and what renders met). Tags are derived, never stored: the
calls that would set or delete some are refused in one line.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor

from aiohttp import web

from ramen.httpd.names import MetricTree
from ramen.httpd.params import one, params
from ramen.httpd.regexes import RegexError, UserRegex
from ramen.httpd.tags import TagError, TagQuery, tagged_name

AUTOCOMPLETE_LIMIT = 100
"""Suggestions an autoComplete answers when not told (graphite-web's TAGDB_AUTOCOMPLETE_LIMIT)."""


class TagRequestError(ValueError):
    """A tag request that cannot be answered (one line for the user: a 400)."""


def add_routes(app: web.Application, tree: Callable[[], MetricTree], pool: Executor) -> None:
    """`tree` gives the metric tree as it stands; it is walked on `pool` (factor values may need a
    replay of the archives' newest hour)."""

    async def on_pool(request: web.Request, answer: Callable[[MetricTree, dict], object]) -> web.Response:
        values = await params(request)
        loop = asyncio.get_running_loop()
        return web.json_response(await loop.run_in_executor(pool, lambda: answer(tree(), values)))

    async def tag_list(request: web.Request) -> web.Response:
        return await on_pool(request, lambda t, v: [{"tag": tag} for tag in _limited(sorted(
            _filtered(_counts(t), one(v, "filter"))), v)])

    async def tag_details(request: web.Request) -> web.Response:
        tag = request.match_info["tag"]
        return await on_pool(request, lambda t, v: _details(t, tag, v))

    async def find_series(request: web.Request) -> web.Response:
        return await on_pool(request, lambda t, v: [tagged_name(tags) for tags, *_ in t.tagged(_query(_exprs(v)))])

    async def complete_tags(request: web.Request) -> web.Response:
        return await on_pool(request, _complete_tags)

    async def complete_values(request: web.Request) -> web.Response:
        return await on_pool(request, _complete_values)

    async def refused(request: web.Request) -> web.Response:
        raise TagRequestError("ramen's tags are its functions' names and factors: they cannot be set or deleted")

    for path in ("/tags/tagSeries", "/tags/tagMultiSeries", "/tags/delSeries"):
        app.router.add_route("*", path, refused)
    for path, handler in (("/tags/findSeries", find_series), ("/tags/autoComplete/tags", complete_tags),
                          ("/tags/autoComplete/values", complete_values), ("/tags", tag_list), ("/tags/", tag_list),
                          ("/tags/{tag}", tag_details)):
        app.router.add_route("GET", path, handler)
        app.router.add_route("POST", path, handler)


def _exprs(values: dict[str, list[str]]) -> list[str]:
    """Graphite takes `expr` repeated, or `expr[]` as jQuery writes lists."""
    return values.get("expr") or values.get("expr[]") or []


def _query(exprs: list[str]) -> TagQuery:
    try:
        return TagQuery(exprs)
    except TagError as e:
        raise TagRequestError(str(e)) from None


def _limited(items: list, values: dict[str, list[str]], default: int | None = None) -> list:
    text = one(values, "limit")
    if text is None:
        return items if default is None else items[:default]
    try:
        limit = int(text)
    except ValueError:
        raise TagRequestError(f"limit must be a whole number, not {text!r}") from None
    return items[:limit] if limit > 0 else items


def _filtered(names, pattern: str | None) -> list[str]:
    """Those a regex matches from their start (graphite-web's `filter`)."""
    if not pattern:
        return list(names)
    try:
        regex = UserRegex(pattern, "filter")
    except RegexError as e:
        raise TagRequestError(str(e)) from None
    return [name for name in names if regex.match(name)]


def _counts(tree: MetricTree, tag: str | None = None) -> Counter:
    """Series per tag (or, of `tag`, per value)."""
    if tag is None:
        return Counter(name for tags, *_ in tree.tagged() for name in tags)
    return Counter(tags[tag] for tags, *_ in tree.tagged() if tag in tags)


def _details(tree: MetricTree, tag: str, values: dict[str, list[str]]) -> dict | None:
    counts = _counts(tree, tag)
    if not counts:
        return None  # as graphite-web answers of a tag no series has
    kept = _limited(sorted(_filtered(counts, one(values, "filter"))), values)
    return {"tag": tag, "values": [{"value": value, "count": counts[value]} for value in kept]}


def _complete_tags(tree: MetricTree, values: dict[str, list[str]]) -> list[str]:
    """The tags of the series the expressions name (those they ask about left out), or all."""
    exprs, prefix = _exprs(values), one(values, "tagPrefix") or ""
    if exprs:
        query = _query(exprs)
        asked = {e.tag for e in query.expressions}
        found = {tag for tags, *_ in tree.tagged(query) for tag in tags if tag not in asked}
    else:
        found = set(_counts(tree))
    return _limited(sorted(tag for tag in found if tag.startswith(prefix)), values, AUTOCOMPLETE_LIMIT)


def _complete_values(tree: MetricTree, values: dict[str, list[str]]) -> list[str]:
    """The values of `tag` among the series the expressions name, or among all."""
    tag, prefix = one(values, "tag"), one(values, "valuePrefix") or ""
    if not tag:
        raise TagRequestError("autoComplete/values: a tag is needed, such as tag=name")
    exprs = _exprs(values)
    series = tree.tagged(_query([*exprs, f"{tag}!="])) if exprs else tree.tagged()
    found = {tags[tag] for tags, *_ in series if tag in tags}
    return _limited(sorted(v for v in found if v.startswith(prefix)), values, AUTOCOMPLETE_LIMIT)
