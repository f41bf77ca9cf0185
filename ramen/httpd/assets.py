"""ramen's own dashboard page and the charting library it draws with, served by httpd itself: no
CDN (a site without internet still charts), and no third-party source in the repository.

The page is hand-written (ramen/httpd/static: no build step). Its charts are uPlot's, which
`.ci/setup` installs from the npm registry into `<venv>/share/ramen/node_modules/uplot`; where it is
missing, `/` answers a page saying how to install it rather than a page whose charts fail.
"""

from __future__ import annotations

import html
import logging
import os
import sys
from pathlib import Path

from aiohttp import web

__all__ = ["STATIC_DIR", "UPLOT_DIR_ENV", "UPLOT_SETUP_COMMAND", "add_routes", "uplot_dir"]

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
UPLOT_DIR_ENV = "RAMEN_UPLOT_DIR"
"""A uPlot `dist/` directory elsewhere than the venv's (a system-wide install, a test's)."""
UPLOT_VERSION = "1.6.32"
"""The version .ci/setup installs: keep the two equal."""
UPLOT_FILES = ("uPlot.iife.min.js", "uPlot.min.css")
"""What the page loads from /vendor/uplot/."""
UPLOT_SETUP_COMMAND = (f"npm install --prefix {Path(sys.prefix) / 'share' / 'ramen'} --no-audit --no-fund "
                       f"uplot@{UPLOT_VERSION}   (or run .ci/setup)")


def uplot_dir() -> Path | None:
    """uPlot's dist/ directory, from $RAMEN_UPLOT_DIR or the venv's share/ramen; None if it lacks
    what the page loads."""
    configured = os.environ.get(UPLOT_DIR_ENV)
    found = Path(configured) if configured else Path(sys.prefix) / "share" / "ramen" / "node_modules" / "uplot" / "dist"
    if all((found / name).is_file() for name in UPLOT_FILES):
        return found
    return None


def _missing_uplot_page(looked_in: str) -> str:
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ramen: uPlot is not installed</title></head>
<body><h1>ramen's dashboard page needs uPlot</h1>
<p>uPlot, the charting library of this page, is not installed (looked in {html.escape(looked_in)}).
Install it on the host running <code>ramen httpd</code>, then reload:</p>
<pre id="setup-command">{html.escape(UPLOT_SETUP_COMMAND)}</pre>
</body></html>
"""


def add_routes(app: web.Application) -> None:
    """`/` (the page), `/static/...` (its script and style), `/vendor/uplot/...` (uPlot's dist/).

    uPlot is looked for once, here: installing it means restarting httpd, as installing any
    dependency does."""
    found = uplot_dir()
    index = (STATIC_DIR / "index.html").read_bytes()

    if found is None:
        looked_in = os.environ.get(UPLOT_DIR_ENV) or str(Path(sys.prefix) / "share" / "ramen")
        log.warning("uPlot is not installed (looked in %s): the dashboard page says how to install it: %s",
                    looked_in, UPLOT_SETUP_COMMAND)
        missing_page = _missing_uplot_page(looked_in)

        async def page(request: web.Request) -> web.Response:
            # 503: the page cannot work on this host until someone installs uPlot, and says so.
            return web.Response(status=503, text=missing_page, content_type="text/html")
    else:
        async def page(request: web.Request) -> web.Response:
            # The page is small and changes with ramen: always revalidate, never a stale script.
            return web.Response(body=index, content_type="text/html", charset="utf-8",
                                headers={"Cache-Control": "no-cache"})
        app.router.add_static("/vendor/uplot", found, name="uplot")

    app.router.add_get("/", page)
    app.router.add_static("/static", STATIC_DIR, name="static")
