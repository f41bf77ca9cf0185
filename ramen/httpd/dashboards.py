"""Dashboards of ramen's own page, kept in the confserver (`dashboards/<name>`) so that every httpd
of a deployment, and every user of it, sees the same ones; and the HTTP routes the page saves,
lists, loads and deletes them through.

One typed definition (`Dashboard`, its `Chart`s): the page's JSON body and the confserver's value are
both `Dashboard.to_value()`, read back with `Dashboard.from_value()`, which names the bad field in
one line (the 400's reason), so a dashboard written by hand or by an older page fails loudly.

The confserver client is synchronous (and thread-safe): handlers call it through
`asyncio.to_thread` so one slow confserver answer does not stall every other request of the loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ramen import keyspace
from ramen.program.durations import MICROS_PER_SECOND
from ramen.times import TimeError, parse_time

__all__ = ["Chart", "Dashboard", "DashboardError", "add_routes", "check_name", "dashboard_key"]

MAX_CHARTS = 64
"""Charts on one dashboard: a page that renders them all at once, so a bound on its refresh's load."""
MAX_TARGETS_PER_CHART = 32
MAX_TEXT_CHARS = 1000
"""Of a title, a target, a time: the longest a person types, far below the confserver's value size."""
MAX_BODY_BYTES = 256 * 1024
"""A PUT body: MAX_CHARTS * MAX_TARGETS_PER_CHART targets of a reasonable length fit well within it."""
MAX_REFRESH_S = 24 * 3600
DEFAULT_FROM = "-1h"
DEFAULT_UNTIL = "now"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class DashboardError(ValueError):
    """A dashboard's name or value that cannot be stored: one line naming the field."""


def check_name(name: str) -> str:
    """The name, if it can name a dashboard: it is a confserver key segment and goes in URLs."""
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_TEXT_CHARS:
        raise DashboardError(f"dashboard name {name!r}: letters, digits, '_', '.' and '-', "
                             f"beginning with a letter or digit")
    return name


def dashboard_key(name: str) -> str:
    return f"{keyspace.DASHBOARDS}/{check_name(name)}"


@dataclass
class Chart:
    title: str
    targets: list[str] = field(default_factory=list)
    """Graphite targets: metric paths with globs, or function calls around them."""

    def to_value(self) -> dict:
        return {"title": self.title, "targets": list(self.targets)}

    @classmethod
    def from_value(cls, value: Any, where: str) -> Chart:
        _check_fields(value, where, required={"targets"}, optional={"title"})
        targets = value["targets"]
        if not isinstance(targets, list):
            raise DashboardError(f"{where}: 'targets' is a list of strings, not {_shown(targets)}")
        if len(targets) > MAX_TARGETS_PER_CHART:
            raise DashboardError(f"{where}: {len(targets)} targets, more than {MAX_TARGETS_PER_CHART}")
        return cls(title=_text(value.get("title", ""), f"{where}: 'title'", empty=True),
                   targets=[_text(t, f"{where}: target {i + 1}") for i, t in enumerate(targets)])


@dataclass
class Dashboard:
    """dashboards/<name>: what the page shows, and over which range by default."""

    name: str
    charts: list[Chart] = field(default_factory=list)
    range_from: str = DEFAULT_FROM
    """Graphite's `from` (`-6h`, `20261125`, `now-1d/d`...), kept as typed so `-6h` stays relative."""
    range_until: str = DEFAULT_UNTIL
    refresh_s: int = 0
    """Seconds between automatic refreshes; 0 for none."""

    def __post_init__(self) -> None:
        check_name(self.name)

    def to_value(self) -> dict:
        return {"name": self.name, "charts": [c.to_value() for c in self.charts],
                "from": self.range_from, "until": self.range_until, "refresh_s": self.refresh_s}

    @classmethod
    def from_value(cls, value: Any, name: str | None = None) -> Dashboard:
        """The dashboard `value` describes; `name` (from its key or URL) is its name, which a name
        in the value must then equal. DashboardError names the bad field."""
        where = f"dashboard {name}" if name else "dashboard"
        _check_fields(value, where, required=set() if name else {"name"},
                      optional={"name", "charts", "from", "until", "refresh_s"})
        if name is None:
            name = value["name"]
        check_name(name)
        if value.get("name", name) != name:
            raise DashboardError(f"{where}: its value names another dashboard, {value['name']!r}")
        charts = value.get("charts", [])
        if not isinstance(charts, list):
            raise DashboardError(f"{where}: 'charts' is a list, not {_shown(charts)}")
        if len(charts) > MAX_CHARTS:
            raise DashboardError(f"{where}: {len(charts)} charts, more than {MAX_CHARTS}")
        refresh_s = value.get("refresh_s", 0)
        if type(refresh_s) is not int or not 0 <= refresh_s <= MAX_REFRESH_S:
            raise DashboardError(f"{where}: 'refresh_s' is whole seconds from 0 (off) to {MAX_REFRESH_S}, "
                                 f"not {_shown(refresh_s)}")
        return cls(name=name,
                   charts=[Chart.from_value(c, f"{where}: chart {i + 1}") for i, c in enumerate(charts)],
                   range_from=_time(value.get("from", DEFAULT_FROM), f"{where}: 'from'", end=False),
                   range_until=_time(value.get("until", DEFAULT_UNTIL), f"{where}: 'until'", end=True),
                   refresh_s=refresh_s)


def _check_fields(value: Any, where: str, *, required: set[str], optional: set[str]) -> None:
    if not isinstance(value, dict):
        raise DashboardError(f"{where}: not a JSON object but {_shown(value)}")
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise DashboardError(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}")
    missing = sorted(required - set(value))
    if missing:
        raise DashboardError(f"{where}: missing field {missing[0]!r}")


def _text(value: Any, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise DashboardError(f"{where} is {'a' if empty else 'a non-empty'} string, not {_shown(value)}")
    if len(value) > MAX_TEXT_CHARS or "\n" in value:
        raise DashboardError(f"{where}: one line of at most {MAX_TEXT_CHARS} characters")
    return value


def _time(value: Any, where: str, *, end: bool) -> str:
    """The time as typed, if /render will read it: checked now, so a dashboard saved with a typo
    fails at save and not at every load."""
    text = _text(value, where)
    try:
        parse_time(text, int(time.time() * MICROS_PER_SECOND), end=end)
    except TimeError as e:
        raise DashboardError(f"{where}: {e}") from None
    return text


def _shown(value: Any) -> str:
    shown = json.dumps(value) if not isinstance(value, str) else repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


# -- HTTP ------------------------------------------------------------------------------------------

def _error(status: type[web.HTTPException], reason: str) -> web.HTTPException:
    """An HTTP error whose body is the one-line reason the page shows, as /render's errors are."""
    return status(text=reason.replace("\n", " ") + "\n", content_type="text/plain")


def add_routes(app: web.Application, client) -> None:
    """GET /dashboards (their names), GET|PUT|DELETE /dashboards/{name} (a Dashboard's JSON).

    `client` is a connected confserver client whose identity may write `dashboards/` (any
    authenticated one, by the default rules)."""
    import confserver  # lazily: ramen reaches the confserver only through a client (DESIGN.md)

    async def conf(call, *args, **kwargs):
        """The client's call off the event loop; its errors as the answer's one line."""
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except confserver.PermissionDenied as e:
            raise _error(web.HTTPForbidden, f"confserver: {e}") from None
        except confserver.ConfError as e:
            raise _error(web.HTTPServiceUnavailable, f"confserver: {e}") from None

    def name_of(request: web.Request) -> str:
        try:
            return check_name(request.match_info["name"])
        except DashboardError as e:
            raise _error(web.HTTPBadRequest, str(e)) from None

    async def list_dashboards(request: web.Request) -> web.Response:
        return web.json_response(await conf(client.children, keyspace.DASHBOARDS))

    async def get_dashboard(request: web.Request) -> web.Response:
        name = name_of(request)
        entry = await conf(client.get_or_none, dashboard_key(name))
        if entry is None:
            raise _error(web.HTTPNotFound, f"no dashboard {name}")
        try:
            dashboard = Dashboard.from_value(entry.value, name)
        except DashboardError as e:
            # Written by something other than this module: say so rather than serve it half-read.
            raise _error(web.HTTPInternalServerError, f"{dashboard_key(name)} in the confserver: {e}") from None
        return web.json_response(dashboard.to_value())

    async def put_dashboard(request: web.Request) -> web.Response:
        name = name_of(request)
        too_large = (request.content_length or 0) > MAX_BODY_BYTES  # refused unread
        body = b"" if too_large else await request.content.read(MAX_BODY_BYTES + 1)
        if too_large or len(body) > MAX_BODY_BYTES:
            raise web.HTTPRequestEntityTooLarge(
                MAX_BODY_BYTES, request.content_length or len(body),
                text=f"dashboard {name}: a body of more than {MAX_BODY_BYTES} bytes\n", content_type="text/plain")
        try:
            value = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _error(web.HTTPBadRequest, f"dashboard {name}: the body is not JSON ({e})") from None
        except RecursionError:
            raise _error(web.HTTPBadRequest, f"dashboard {name}: the body's JSON is nested too deeply") from None
        try:
            dashboard = Dashboard.from_value(value, name)
        except DashboardError as e:
            raise _error(web.HTTPBadRequest, str(e)) from None
        await conf(client.set, dashboard_key(name), dashboard.to_value())
        return web.json_response(dashboard.to_value())

    async def delete_dashboard(request: web.Request) -> web.Response:
        name = name_of(request)
        if not await conf(client.discard, dashboard_key(name)):
            raise _error(web.HTTPNotFound, f"no dashboard {name}")
        return web.Response(status=204)

    app.router.add_get("/dashboards", list_dashboards)
    app.router.add_get("/dashboards/{name}", get_dashboard)
    app.router.add_put("/dashboards/{name}", put_dashboard)
    app.router.add_delete("/dashboards/{name}", delete_dashboard)
