"""A real graphite-web (Debian's `graphite-web` 1.1.8) for tests: a process of its own whose
CLUSTER_SERVERS names a ramen httpd (or a stand-in), so a test proves that graphite-web's cluster
federation charts ramen's series.

It runs with the system /usr/bin/python3 and Debian's Django, never from our venv (graphite-web is
not a dependency of ramen: it is the program at the other end of the wire). Everything it writes
(settings module, sqlite database, logs, an empty whisper tree) lives in a directory of the test's:
nothing under /etc or /var is read or written, because Debian's settings.py only reads
/etc/graphite/local_settings.py when GRAPHITE_SETTINGS_MODULE is left at `local_settings`.

Served by Django's own `runserver --noreload` (threaded): Debian installs no WSGI server with
graphite-web, and a test needs nothing more.
"""

from __future__ import annotations

import importlib
import os
import secrets
import socket
import subprocess
import sys
import warnings
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.waiting import wait_for

SYSTEM_PYTHON = Path("/usr/bin/python3")
"""Debian's Python, which has Debian's Django and graphite-web on its path."""
GRAPHITE_PACKAGE = Path("/usr/lib/python3/dist-packages/graphite")
DEBIAN_DIST_PACKAGES = str(GRAPHITE_PACKAGE.parent)
SETTINGS_MODULE = "ramen_test_graphite_settings"
"""Our local_settings module; any name but `local_settings` keeps /etc/graphite out."""
HOST = "127.0.0.1"
STOP_WAIT_S = 10.0
MIGRATE_TIMEOUT_S = 120.0
FETCH_TIMEOUT_S = 60.0
"""graphite-web's wait for a cluster server's /render (its default, 6 s, is short for a render that
is a replay behind the supervisor's merge delay on a loaded test machine)."""
FIND_TIMEOUT_S = 30.0
LOG_TAIL_BYTES = 4000


def absent_reason() -> str | None:
    """Why graphite-web cannot run here, or None when it can."""
    if not SYSTEM_PYTHON.is_file():
        return f"{SYSTEM_PYTHON} is absent (graphite-web runs on Debian's Python)"
    if not GRAPHITE_PACKAGE.is_dir():
        return f"graphite-web is not installed ({GRAPHITE_PACKAGE} is absent; apt-get install graphite-web)"
    probe = subprocess.run([str(SYSTEM_PYTHON), "-c", "import django, tagging, graphite"], env=_clean_env(None),
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"graphite-web's dependencies do not import: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def cluster_server(url: str, fmt: str = "pickle") -> str:
    """A CLUSTER_SERVERS entry for a server at `url` (http://host:port) answering in `fmt`.

    graphite-web's RemoteFinder reads `format` from the entry's query string (pickle by default,
    or msgpack) and appends `/metrics/find/` and `/render/` to the rest, so the entry must not end
    with a slash."""
    base = url.rstrip("/")
    return base if fmt == "pickle" else f"{base}?format={fmt}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class GraphiteWeb:
    """One graphite-web process under `root`, federating `cluster_servers`.

    `use_post` sets REMOTE_STORE_USE_POST: graphite-web then POSTs its cluster requests as
    multipart/form-data (urllib3's encoding of `fields`), instead of GETs with a query string."""

    def __init__(self, root: Path, cluster_servers: Sequence[str], *, use_post: bool = False) -> None:
        self.root = root
        self.cluster_servers = list(cluster_servers)
        self.use_post = use_post
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.log_path = root / "graphite-web.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def write_settings(self) -> None:
        storage = self.root / "storage"
        for folder in (storage / "log", storage / "whisper"):
            folder.mkdir(parents=True, exist_ok=True)
        settings = {
            "SECRET_KEY": secrets.token_hex(16),
            "STORAGE_DIR": str(storage),
            "LOG_DIR": str(storage / "log"),
            "INDEX_FILE": str(storage / "index"),
            "WHISPER_DIR": str(storage / "whisper"),
            "STANDARD_DIRS": [str(storage / "whisper")],
            "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(storage / "graphite.db")}},
            "CLUSTER_SERVERS": self.cluster_servers,
            "REMOTE_STORE_USE_POST": self.use_post,
            # No cache anywhere: CACHES stays Django's DummyCache (no MEMCACHE_HOSTS), finds and
            # renders are not cached, so every request reaches the cluster server.
            "FIND_CACHE_DURATION": 0,
            "DEFAULT_CACHE_DURATION": 0,
            # A cluster server that failed once is otherwise ignored for 60 s.
            "REMOTE_RETRY_DELAY": 0.0,
            "FIND_TIMEOUT": FIND_TIMEOUT_S,
            "FETCH_TIMEOUT": FETCH_TIMEOUT_S,
            "LOG_ROTATION": False,
            "ALLOWED_HOSTS": ["*"],
        }
        text = "".join(f"{key} = {value!r}\n" for key, value in settings.items())
        (self.root / f"{SETTINGS_MODULE}.py").write_text('"""Written by tests/httpd/graphite_web.py."""\n' + text)

    def migrate(self) -> None:
        """`django-admin migrate` of graphite-web's sqlite database (its tag and dashboard tables)."""
        done = subprocess.run([str(SYSTEM_PYTHON), "-m", "django", "migrate", "--noinput"], env=_clean_env(self.root),
                              cwd=self.root, capture_output=True, text=True, timeout=MIGRATE_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"graphite-web migrate failed: {done.stderr.strip()[-LOG_TAIL_BYTES:]}")

    def start(self) -> GraphiteWeb:
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_settings()
        self.migrate()
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(SYSTEM_PYTHON), "-m", "django", "runserver", "--noreload", f"{HOST}:{self.port}"],
                env=_clean_env(self.root), cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT)
        wait_for(self._answers, f"graphite-web answering on {self.url} (log: {self.log_path})")
        return self

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"graphite-web exited with {self.process.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/version/", timeout=5) as answer:
                return answer.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    def exception_log(self) -> str:
        """graphite-web's own log of exceptions (a cluster server's bad answer lands there)."""
        path = self.root / "storage" / "log" / "exception.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> GraphiteWeb:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _clean_env(root: Path | None) -> dict[str, str]:
    """Debian's Python with only graphite-web's settings on its path: none of our venv's variables
    (PYTHONPATH, VIRTUAL_ENV) may leak into it."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if root is not None:
        env.update(PYTHONPATH=str(root), DJANGO_SETTINGS_MODULE="graphite.settings",
                   GRAPHITE_SETTINGS_MODULE=SETTINGS_MODULE)
    return env


@pytest.fixture
def graphite_web(tmp_path) -> Iterator[Callable[..., GraphiteWeb]]:
    """Starts graphite-webs: `graphite_web([cluster_server(url)], use_post=False)` returns a running
    one (its `.url`); all are stopped at the end of the test. Skips, saying why, only where
    graphite-web is absent."""
    reason = absent_reason()
    if reason:
        pytest.skip(reason)
    started: list[GraphiteWeb] = []

    def start(cluster_servers: Sequence[str], *, use_post: bool = False) -> GraphiteWeb:
        server = GraphiteWeb(tmp_path / f"graphite-web-{len(started)}", cluster_servers, use_post=use_post)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def graphite_modules(*names: str) -> list:
    """Debian's graphite-web modules imported into this process (Django set up with graphite's
    own settings), to check ramen against graphite-web's code; skips the test where they cannot be
    imported. Debian's dist-packages is on sys.path only while importing, and DJANGO_SETTINGS_MODULE
    is not left behind for the subprocesses of later tests."""
    sys.path.insert(0, DEBIAN_DIST_PACKAGES)
    had_settings = "DJANGO_SETTINGS_MODULE" in os.environ
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "graphite.settings")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import django
            django.setup()
            return [importlib.import_module(name) for name in names]
    except Exception as error:  # noqa: BLE001 - any failure to import means: not here
        pytest.skip(f"graphite-web is not importable here: {error}")
    finally:
        sys.path.remove(DEBIAN_DIST_PACKAGES)
        if not had_settings:
            os.environ.pop("DJANGO_SETTINGS_MODULE")
