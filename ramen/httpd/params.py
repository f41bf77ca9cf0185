"""A request's parameters as Graphite's API takes them: the query's and a POSTed form's together
(Grafana POSTs a form), each name with all its values, the last one counting where one is wanted."""

from __future__ import annotations

from aiohttp import web

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


async def params(request: web.Request) -> dict[str, list[str]]:
    """Query and form parameters together, each name with all its values (a file upload left out)."""
    out: dict[str, list[str]] = {}
    for key, value in request.query.items():
        out.setdefault(key, []).append(value)
    if request.method == "POST" and request.content_type in FORM_TYPES:
        for key, value in (await request.post()).items():
            if isinstance(value, str):
                out.setdefault(key, []).append(value)
    return out


def one(values: dict[str, list[str]], name: str, default: str | None = None) -> str | None:
    """The last value of `name`, or `default`."""
    found = values.get(name)
    return found[-1] if found else default


def flag(values: dict[str, list[str]], name: str) -> bool:
    """A yes-or-no parameter: `1` or `true` (any case) is yes, anything else or none no."""
    return (one(values, name) or "").lower() in ("1", "true")
