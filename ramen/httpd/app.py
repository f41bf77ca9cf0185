"""The HTTP application: routes, credentials, request parameters, and the answers' formats. A
render's work is in renderer.py, the state every request shares in state.py.

Handlers never block the event loop: what reads the confserver or evaluates targets runs on the
thread pool of `Httpd`, the fetches of buckets (the cache, replays) on a pool of their own (a thread
per function of a render: a dashboard's renders must all ask for their replays within the
supervisor's merge delay, so that pool is large and its threads mostly wait; the long replays it
runs are bounded by ramen/httpd/admission.py). A render whose client leaves is cancelled (aiohttp
cancels its handler), and so are the replays no other render waits for.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from ramen.httpd import assets, dashboards, metrics, render, tagdb
from ramen.httpd import functions as graphite_functions
from ramen.httpd.auth import addressed_to_loopback
from ramen.httpd.errors import USER_ERRORS, BadRequest, headers_of, status_of
from ramen.httpd.params import flag, one, params
from ramen.httpd.renderer import evaluate_targets
from ramen.httpd.series import DEFAULT_XFILES_FACTOR
from ramen.httpd.state import Httpd
from ramen.times import TimeError, parse_time

log = logging.getLogger(__name__)

GRAPHITE_VERSION = "1.1.10"
"""What /version answers: a 1.1.x graphite-web, so Grafana turns on its 1.1 features (functions
from /functions, tags)."""
MAX_REQUEST_BYTES = 1024 * 1024
MAX_DATA_POINTS = 100_000
DEFAULT_FROM, DEFAULT_UNTIL = "-24h", "now"

# -- request helpers ---------------------------------------------------------------------------------

HTTPD = web.AppKey("httpd", Httpd)


def time_range(values: dict[str, list[str]], httpd: Httpd) -> tuple[int, int, int]:
    """from, until and now in epoch seconds, from Graphite's grammar (and its `now` parameter)."""
    now_us = httpd.clock.epoch_us()
    if (now := one(values, "now")) is not None:
        now_us = _parse(now, now_us, "now")
    since_us = _parse(one(values, "from", DEFAULT_FROM), now_us, "from")
    until_us = _parse(one(values, "until", DEFAULT_UNTIL), now_us, "until", end=True)
    since_s, until_s = since_us // 1_000_000, -(-until_us // 1_000_000)
    if since_s >= until_s:
        raise BadRequest(f"from ({one(values, 'from', DEFAULT_FROM)}) is not before until "
                         f"({one(values, 'until', DEFAULT_UNTIL)})")
    if until_s - since_s > httpd.limits.max_range_s:
        raise BadRequest(f"the range is longer than {httpd.limits.max_range_s // 86400} days")
    return since_s, until_s, now_us // 1_000_000


def _parse(text: str, now_us: int, name: str, *, end: bool = False) -> int:
    # Grafana sends `from=-6h` and `until=now`, or epoch seconds; graphite-web also takes `-6hours`.
    try:
        return parse_time(text, now_us, end=end)
    except TimeError as e:
        raise BadRequest(f"{name}: {e}") from None


@web.middleware
async def guard(request: web.Request, handler):
    """Who asks first (a loopback Host without credentials, else the credentials), then user errors
    as one-line 400s, and bugs as 500s with a traceback in the log (never in the answer)."""
    httpd = request.app[HTTPD]
    if httpd.credentials is None and not addressed_to_loopback(request.headers.get("Host")):
        return web.Response(status=403, text=f"httpd without --auth answers requests to 127.0.0.1 or localhost only, "
                                             f"not to {request.headers.get('Host')!r}\n")
    if httpd.credentials is not None and not httpd.credentials.allows(request.headers.get("Authorization")):
        return web.Response(status=401, text="credentials needed\n",
                            headers={"WWW-Authenticate": 'Basic realm="ramen"'})
    try:
        response = await handler(request)
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            httpd.stats.add("bytes_served", len(response.body))
        return response
    except USER_ERRORS as e:
        return web.Response(status=status_of(e), text=f"{e}\n", headers=headers_of(e))
    except web.HTTPException:
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path_qs)
        return web.Response(status=500, text="internal error: see httpd's log\n")


# -- handlers -------------------------------------------------------------------------------------------

async def version(request: web.Request) -> web.Response:
    return web.Response(text=GRAPHITE_VERSION)


async def no_events(request: web.Request) -> web.Response:
    """/events/get_data: ramen keeps no events; Grafana asks (an annotation query on a Graphite data
    source), and takes an empty answer."""
    return web.json_response([])


async def progress(request: web.Request) -> web.Response:
    found = request.app[HTTPD].progress.get(request.query.get("requestId", ""))
    return web.json_response(found.to_dict() if found else {"state": "unknown"})


async def find(request: web.Request) -> web.Response:
    httpd = request.app[HTTPD]
    values = await params(request)
    query = one(values, "query")
    if not query:
        raise BadRequest("find: a query is needed, such as query=*")
    fmt = one(values, "format", "treejson")
    if fmt not in render.FIND_FORMATS:
        raise BadRequest(f"find: unknown format {fmt!r} ({', '.join(render.FIND_FORMATS)})")
    loop = asyncio.get_running_loop()
    nodes = await loop.run_in_executor(httpd.pool, lambda: httpd.tree().find(query))
    return _answer(render.to_find(nodes, fmt, wildcards=flag(values, "wildcards"), query=query), fmt)


async def expand(request: web.Request) -> web.Response:
    httpd = request.app[HTTPD]
    values = await params(request)
    queries = values.get("query", [])
    if not queries:
        raise BadRequest("expand: a query is needed, such as query=net.*")
    leaves_only = one(values, "leavesOnly", "0") == "1"
    loop = asyncio.get_running_loop()

    def run() -> list[str]:
        tree = httpd.tree()
        out = set()
        for query in queries:
            out.update(f.path for f in tree.find(query) if f.leaf or not leaves_only)
        return sorted(out)

    return web.json_response({"results": await loop.run_in_executor(httpd.pool, run)})


async def functions(request: web.Request) -> web.Response:
    """graphite-web's /functions: `group`, `grouped=1`, `type=pie`; /functions/<name> one of them."""
    values = await params(request)
    listed = graphite_functions.describe_functions(one(values, "group"), flag(values, "grouped"),
                                                   pie=one(values, "type") == "pie")
    name = request.match_info.get("name")
    if name is None:
        return web.json_response(listed)
    if name not in listed:
        return web.json_response({"error": f"Function not found: {name}"}, status=404)
    return web.json_response(listed[name])


RENDER_FORMATS = ("json", "csv", "pickle", "msgpack")
MAX_BATCH_RENDERS = 100


async def render_handler(request: web.Request) -> web.Response:
    """Graphite's /render: `target` repeated, from/until, format, maxDataPoints (json), xFilesFactor."""
    httpd = request.app[HTTPD]
    httpd.stats.renders += 1
    try:
        values = await params(request)
        fmt = one(values, "format", "json")
        if fmt not in RENDER_FORMATS:
            raise BadRequest(f"render: unknown format {fmt!r} ({', '.join(RENDER_FORMATS)})")
        since_s, until_s, now_s = time_range(values, httpd)
        max_points = _max_data_points(one(values, "maxDataPoints"))
        results = await evaluate_targets(httpd, values.get("target", []), since_s, until_s, now_s,
                                         request_id=one(values, "requestId"),
                                         no_cache=flag(values, "noCache"),
                                         xfiles_factor=_xfiles_factor(one(values, "xFilesFactor")))
    except Exception:
        httpd.stats.add("render_errors")
        raise
    if fmt in render.LOCAL_FORMATS:
        return _answer(render.to_local(results, fmt), fmt)
    if fmt == "csv":
        return _answer(render.to_csv(results), fmt)
    return _answer(render.to_json(results, max_points), fmt)


async def render_batch_handler(request: web.Request) -> web.Response:
    """POST /render/batch: several renders over one range, answered together.

    Body: {"from", "until", "renders": [{"targets": [...], "maxDataPoints": n, "requestId": id}]}.
    Answer: one item per render, {"series": [<as /render?format=json>]} or {"status": 400|502|500,
    "error": "<one line>"}.
    ramen's page refreshes its charts with it: a browser opens at most 6 connections to a host,
    so past 6 charts one request per chart would queue, and miss the supervisor's merge delay."""
    httpd = request.app[HTTPD]
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("render/batch: the body is not JSON") from None
    except RecursionError:
        raise BadRequest("render/batch: the body's JSON is nested too deeply") from None
    renders = body.get("renders") if isinstance(body, dict) else None
    if not isinstance(renders, list) or not all(isinstance(r, dict) for r in renders):
        raise BadRequest('render/batch: expected {"from", "until", "renders": [{"targets": [...]}, ...]}')
    if len(renders) > MAX_BATCH_RENDERS:
        raise BadRequest(f"render/batch: {len(renders)} renders, more than {MAX_BATCH_RENDERS}")
    since_s, until_s, now_s = time_range({k: [str(body[k])] for k in ("from", "until", "now") if k in body}, httpd)

    async def one_render(spec: dict) -> bytes:
        httpd.stats.renders += 1
        try:
            targets = spec.get("targets")
            if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
                raise BadRequest("render: targets must be a list of strings")
            max_points = _max_data_points(str(spec["maxDataPoints"]) if "maxDataPoints" in spec else None)
            results = await evaluate_targets(httpd, targets, since_s, until_s, now_s,
                                             request_id=spec.get("requestId"), no_cache=bool(spec.get("noCache")))
            return b'{"series":' + render.to_json(results, max_points) + b"}"
        except USER_ERRORS as e:
            httpd.stats.add("render_errors")
            return json.dumps({"status": status_of(e), "error": str(e)}).encode()
        except Exception:
            httpd.stats.add("render_errors")
            log.exception("render/batch: a render of %s failed", spec.get("targets"))
            return json.dumps({"status": 500, "error": "internal error: see httpd's log"}).encode()

    answers = await asyncio.gather(*(one_render(spec) for spec in renders))
    return _answer(b"[" + b",".join(answers) + b"]", "json")


def _xfiles_factor(text: str | None) -> float:
    if text is None or text == "":
        return DEFAULT_XFILES_FACTOR
    try:
        share = float(text)
    except ValueError:
        raise BadRequest(f"xFilesFactor {text!r} is not a number") from None
    if not 0 <= share <= 1:
        raise BadRequest(f"xFilesFactor must be within 0..1, not {text}")
    return share


def _max_data_points(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        points = int(float(text))
    except ValueError:
        raise BadRequest(f"maxDataPoints {text!r} is not a number") from None
    except OverflowError:  # inf, or too many digits for a float
        raise BadRequest(f"maxDataPoints must be within 1..{MAX_DATA_POINTS}") from None
    if not 1 <= points <= MAX_DATA_POINTS:
        raise BadRequest(f"maxDataPoints must be within 1..{MAX_DATA_POINTS}")
    return points


CONTENT_TYPES = {"json": "application/json", "treejson": "application/json", "completer": "application/json",
                 "csv": "text/csv", "pickle": "application/pickle", "msgpack": "application/x-msgpack"}


def _answer(body: bytes, fmt: str) -> web.Response:
    return web.Response(body=body, content_type=CONTENT_TYPES.get(fmt, "application/octet-stream"))


def make_app(httpd: Httpd) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_REQUEST_BYTES)
    app[HTTPD] = httpd
    for path, handler in (("/render", render_handler), ("/metrics/find", find), ("/metrics/expand", expand)):
        for suffix in ("", "/"):
            app.router.add_route("GET", path + suffix, handler)
            app.router.add_route("POST", path + suffix, handler)
    app.router.add_post("/render/batch", render_batch_handler)
    app.router.add_get("/version", version)
    app.router.add_get("/functions", functions)
    app.router.add_get("/functions/{name}", functions)
    app.router.add_get("/progress", progress)
    metrics.add_routes(app, client=httpd.client, site=httpd.site, stats=httpd.stats)
    tagdb.add_routes(app, httpd.tree, httpd.pool)
    app.router.add_route("*", "/events/get_data", no_events)
    assets.add_routes(app)
    dashboards.add_routes(app, httpd.client)
    app.on_cleanup.append(_close)
    return app


async def _close(app: web.Application) -> None:
    app[HTTPD].close()

