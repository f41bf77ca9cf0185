"""`ramen start [--dir DIR] [PROGRAM…]` and `ramen stop`: the embedded default on this host.

`ramen start` runs the confserver (unless --confserver names one), the choreographer, the
supervisor and the archiver as child processes (and a local Spark Connect server when a program
needs Spark, unless --spark names one: ramen/cli/spark_service.py), each logging to `DIR/logs/<service>.log`, loads
the programs given, and keeps the services running until Ctrl-C, SIGTERM or SIGHUP, when it stops them in
reverse order: a service that dies is restarted with backoff, one that is running but stuck (the
confserver no longer answers its probe, another's heartbeat in `DIR/run/` stops) is killed and
restarted (ramen/cli/keeper.py). `--daemon` runs all that in the background; `ramen stop` stops it.

The services are started as `python -m <module>`: the CLI imports none of them.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ramen import keyspace, paths
from ramen.cli import argtypes, conf
from ramen.cli.keeper import (ARCHIVER_STUCK_AFTER_S, HEARTBEAT_STUCK_AFTER_S, PROBE_STUCK_AFTER_S, STOP_GRACE_S,
                              Keeper, Service)
from ramen.cli.spark_service import SparkService, programs_need_spark
from ramen.cli.errors import UserError
from ramen.listen import parse_listen
from ramen.locks import FileLock, LockHeld, holders
from ramen.memory import arrow_on_the_c_allocator
from ramen.netd.defaults import DEFAULT_LISTEN as NETD_DEFAULT_LISTEN
from ramen.processes import INSTANCE_ENV, command_line, instance_processes, running, stop_processes
from ramen.spark.session import configured_remote, configured_staging
from ramen.transport.udp.setup_key import SetupKey, SetupKeyError

DEFAULT_LISTEN = "127.0.0.1:0"
"""A free port: instances side by side on one host never collide (each writes where it listens)."""
STARTUP_TIMEOUT_S = 30.0
DAEMON_READY_TIMEOUT_S = 180.0
"""--daemon waits this long for the services, Spark's cold start and the programs' SQL checks."""
LEFT_OVER_TIMEOUT_S = 60.0
"""For stopping what a dead supervisor left: its start-up, then a shutdown's own 10 s bound."""
CONFSERVER_CONNECT_TIMEOUT_S = 1.0
"""How long a TCP connect to the confserver may take, on the way down, to count as reachable."""
STOP_ROUNDS = 3
"""Times `ramen stop` looks again for processes of its instance, after stopping those it found."""
POLL_INTERVAL_S = 0.2
CONFSERVER_MODULE = "confserver.server"
CONFSERVER_ANSWERED_WITHIN_S = 3.0
"""Spark's turns call the confserver only if it answered a probe this recently (a call to a stuck
one only waits)."""
PID_FILE = paths.PID_FILE_NAME
HEARTBEAT_SUFFIX = ".heartbeat"
READY_FILE = paths.READY_FILE_NAME
INSTANCE_FILE = "instance"
"""The token every process of this instance carries in its environment (ramen/processes.py)."""
ERROR_PREFIX = "ramen: "
"""How ramen's processes begin the one-line error they end with (ramen.cli.errors), in their logs."""


def add_parser(sub) -> None:
    start = sub.add_parser("start",
                           description="Run ramen's services on this host (the embedded default) and load "
                                       "the programs given, until Ctrl-C or SIGTERM.")
    start.add_argument("programs", nargs="*", metavar="PROGRAM", help="program files to load (replacing)")
    start.add_argument("--confserver", metavar="URL", help="use this confserver instead of starting one")
    start.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                       help="where the embedded confserver listens (default %(default)s: a free port, which it "
                            "writes into DIR/confserver/address for the commands given the same --dir)")
    start.add_argument("--site", default=keyspace.default_site(), type=argtypes.site,
                       help="this host's site (default %(default)s)")
    start.add_argument("--daemon", action="store_true", help="run in the background; `ramen stop` stops it")
    start.add_argument("--no-httpd", dest="httpd", action="store_false",
                       help="do not start httpd (the dashboards, the Graphite API and /metrics)")
    start.add_argument("--httpd-listen", metavar="HOST:PORT", default=None,
                       help="where httpd listens (default 127.0.0.1:29380, else a free port when taken; "
                            "the URL is kept in DIR/run/httpd.url)")
    start.add_argument("--httpd-auth", metavar="FILE", default=None,
                       help="httpd's credentials (`bearer TOKEN` or `basic USER PASSWORD` lines): required for a "
                            "--httpd-listen beyond this host")
    start.add_argument("--netd", dest="netd", action="store_true", default=None,
                       help="start netd, which sends and receives streams between sites (default: at once when "
                            "--site names a site other than the default one, else once a stream crosses sites)")
    start.add_argument("--no-netd", dest="netd", action="store_false", help="do not start netd")
    start.add_argument("--netd-listen", metavar="HOST:PORT", default=NETD_DEFAULT_LISTEN,
                       help="where netd receives streams from other sites (default %(default)s: a free port, "
                            "announced in the confserver)")
    start.add_argument("--netd-allow", metavar="NETWORK", action="append", type=argtypes.network, default=[],
                       help="netd takes datagrams only from this address or network (repeatable; default: any)")
    start.add_argument("--netd-setup-key", metavar="FILE", default=None,
                       help="netd signs its SETUPs with the secret in FILE and takes only SETUPs signed with it "
                            "(the same file on every site that sends to another; chmod 600)")
    start.add_argument("--spark", metavar="sc://HOST:PORT", default=configured_remote(),
                       help="run heavy functions on this Spark Connect endpoint (default $RAMEN_SPARK_REMOTE; "
                            "without it, a local one starts when a program needs Spark)")
    start.add_argument("--spark-staging", metavar="DIR|URI", default=configured_staging(),
                       help="where heavy workers write rows as Parquet for Spark to read: a directory at the same "
                            "path on every Spark node, or an hdfs:// or s3a:// URI the cluster reads (default "
                            "$RAMEN_SPARK_STAGING; without it, rows go to a remote Spark over Spark Connect)")
    start.set_defaults(run=run_start)
    stop = sub.add_parser("stop",
                          description="Stop the services started by `ramen start --daemon`.")
    stop.set_defaults(run=run_stop)


def _base(args) -> Path:
    """The instance's directory: the global --dir (ramen/cli/main.py has put it in $RAMEN_DIR)."""
    base = paths.ramen_dir().resolve()
    os.environ[paths.RAMEN_DIR_ENV] = str(base)  # so every path below, and every child, agrees
    return base


def _check_httpd_options(args) -> None:
    """httpd's --listen and --auth, checked before anything starts: a listen beyond this host
    without credentials, or credentials httpd cannot read, would otherwise start every service but
    httpd, which exits and is restarted again and again with the dashboards off."""
    if not args.httpd:
        return
    from ramen.httpd.auth import AuthError, Credentials, check_listen
    try:
        host = parse_listen(args.httpd_listen)[0] if args.httpd_listen else "127.0.0.1"
        check_listen(host, Credentials.load(_absolute(args.httpd_auth)) if args.httpd_auth else None)
    except (ValueError, AuthError) as e:  # worded with httpd's options: named as this command's
        raise UserError(f"httpd: {e}".replace("--listen", "--httpd-listen").replace("--auth", "--httpd-auth")) from None


def _check_netd_options(args) -> None:
    """netd's setup key, read before anything starts (else netd alone would exit, again and again)."""
    if args.netd_setup_key is not None:
        try:
            SetupKey.load(_absolute(args.netd_setup_key))
        except SetupKeyError as e:
            raise UserError(f"netd: {e}") from None


def run_start(args) -> int:
    _check_httpd_options(args)
    _check_netd_options(args)
    base = _base(args)
    run_dir = base / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.daemon:
        return _daemonize(args, base, run_dir)
    pid_file = run_dir / PID_FILE
    try:
        # Held for as long as this process lives, however it ends: the pid in the file is ours
        # exactly while the lock is (a stale file, whose pid may be a stranger's now, is not locked).
        pid_lock = FileLock.acquire(pid_file, create=True)
    except LockHeld as e:
        raise UserError(f"ramen is already running from {base} (pid {e.pid or '?'}): ramen stop") from None
    pid_file.write_text(f"{os.getpid()}\n")
    (run_dir / READY_FILE).unlink(missing_ok=True)
    token = secrets.token_hex(8)
    os.environ[INSTANCE_ENV] = token  # before any child starts: all of them, and theirs, carry it
    # Whole or absent for a command reading them meanwhile (`ramen --dir` finds its site there).
    paths.write_atomically(run_dir / INSTANCE_FILE, f"{token}\n")
    paths.write_atomically(run_dir / paths.SITE_FILE_NAME, f"{args.site}\n")
    from confserver import AUTH_FILE_ENV
    if args.confserver and (auth := os.environ.get(AUTH_FILE_ENV)):
        paths.write_atomically(run_dir / paths.AUTH_FILE_NAME, f"{Path(auth).resolve()}\n")
    logs = base / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RAMEN_SITE=args.site)
    services: list[Service] = []
    prober = None
    stopping = []
    starting = [True]  # until the services run: a signal then ends whatever start waits on, at once

    def on_signal(*_) -> None:
        stopping.append(True)
        if starting and len(stopping) == 1:
            # Not after the wait it came in (the confserver's start, httpd's URL, Spark, a program's
            # load): the services started so far are stopped below, and any process started as it came.
            raise KeyboardInterrupt
    # SIGINT too: a shell may start us with it ignored; SIGHUP: the terminal we run in was closed.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        if args.confserver:
            url = args.confserver
        else:
            url = _start_confserver(base, env, logs, services, args.listen)
            prober = _probe(services[0], url)
        # Children find their tokens in DIR/confserver/auth.json through RAMEN_DIR.
        env["RAMEN_CONFSERVER"] = os.environ["RAMEN_CONFSERVER"] = url
        # The archiver before the supervisor: it records workers from their first tuple, and on the
        # way down (in reverse) the workers stop while their recorder is still there.
        for name, argv, stuck_after_s in (
                ("choreographer", ["choreographer.service", "--site", args.site], HEARTBEAT_STUCK_AFTER_S),
                ("archiver", ["workers.archiver", "--dir", str(paths.archive_dir(args.site)),
                              "--counters", str(paths.counters_path()), "--follow-site", args.site],
                 ARCHIVER_STUCK_AFTER_S),
                *([_netd_argv(args)] if _wants_netd(args) else []),
                ("supervisor", ["supervisor.service", "--site", args.site], HEARTBEAT_STUCK_AFTER_S)):
            _start_heartbeating(name, argv, stuck_after_s, run_dir, logs, env, services)
        httpd = _start_httpd(args, env, logs, services) if args.httpd else None

        def start_service(name: str, command: list[str], service_env: dict, log_name: str) -> Service:
            service = Service(name, [], log_path=logs / log_name, command=command, env=service_env)
            service.start(env)
            services.append(service)
            return service

        with conf.connected(_user_args()) as client:
            spark = SparkService(client, base, args.spark, start_service, staging=args.spark_staging,
                                 cancelled=lambda: bool(stopping))
            if programs_need_spark(args.programs):
                spark.start_local(wait=True)
            _load_programs(client, args.programs)
            page = _httpd_url(httpd) if httpd else None
            paths.write_atomically(run_dir / READY_FILE, f"{url}\n")
            print(f"ramen: running from {base} (confserver {url}, site {args.site}); logs in {logs}; Ctrl-C stops",
                  file=sys.stderr, flush=True)
            if page:
                print(f"ramen: dashboards at {page}", file=sys.stderr, flush=True)
            netd = None if args.netd is not None or _wants_netd(args) else _NetdOnDemand(
                client, args.site, lambda: _start_heartbeating(*_netd_argv(args), run_dir, logs, env, services))
            turns = _Turns(spark, netd, services[0] if prober else None).start()
            starting.clear()
            try:
                _keep_running(Keeper(services, env), stopping, turns)
            finally:
                turns.close()
    except KeyboardInterrupt:
        pass
    finally:
        starting.clear()
        if prober is not None:
            prober.close()
        for service in reversed(services):
            service.stop()
            if service.name == "supervisor" and service.process.returncode != 0:
                _stop_left_over(service, env, args.site, env.get("RAMEN_CONFSERVER"))
        _stop_instance_processes(token)
        _remove_result_logs()
        pid_file.unlink(missing_ok=True)
        pid_lock.release()
        (run_dir / READY_FILE).unlink(missing_ok=True)
        (run_dir / INSTANCE_FILE).unlink(missing_ok=True)
        (run_dir / paths.SITE_FILE_NAME).unlink(missing_ok=True)
        (run_dir / paths.AUTH_FILE_NAME).unlink(missing_ok=True)
    print("ramen: stopped", file=sys.stderr)
    return 0


def _wants_netd(args) -> bool:
    """netd from the start: asked for, or the site was named (a deployment of several sites);
    else (the default site) on demand, see _NetdOnDemand."""
    return args.netd if args.netd is not None else args.site != keyspace.DEFAULT_SITE


def _netd_argv(args) -> tuple[str, list[str], float]:
    allow = [word for network in args.netd_allow for word in ("--allow", str(network))]
    key = ["--setup-key", str(_absolute(args.netd_setup_key))] if args.netd_setup_key else []
    return "netd", ["ramen.netd.service", "--site", args.site, "--listen", args.netd_listen, *allow, *key], \
        HEARTBEAT_STUCK_AFTER_S


def _start_heartbeating(name: str, argv: list[str], stuck_after_s: float, run_dir: Path, logs: Path, env: dict,
                        services: list[Service]) -> Service:
    """A service the keeper restarts if it dies or its heartbeat stops."""
    service = Service(name, argv, log_path=logs / f"{name}.log", heartbeat_path=run_dir / f"{name}{HEARTBEAT_SUFFIX}",
                      stuck_after_s=stuck_after_s)
    service.start(env)
    services.append(service)
    return service


class _NetdOnDemand:
    """netd, started the first time the site has a stream to send to or receive from another site
    (the choreographer writes those keys): a site that shares no stream runs no netd, one that does
    never waits for someone to have said --netd. --netd and --no-netd decide at start instead."""

    def __init__(self, client, site: str, start: Callable[[], Service]) -> None:
        self.client = client
        self.site = site
        self.start = start
        self.started = False

    def poll(self) -> None:
        """Its keys are named after a function (sites/<site>/net/sends/<prog>/<func>@<site>, the
        choreographer's) or a replayer (…/replayer-<id>, a supervisor's)."""
        if self.started:
            return
        if any(self.client.glob(pattern) for prefix in (keyspace.net_sends_prefix(self.site),
                                                        keyspace.net_receives_prefix(self.site))
               for pattern in (f"{prefix}/*", f"{prefix}/*/*")):
            self.start()
            self.started = True
            print(f"ramen: starting netd: site {self.site} exchanges streams with another site", file=sys.stderr,
                  flush=True)


def _start_confserver(base: Path, env: dict, logs: Path, services: list[Service], listen: str) -> str:
    ready = base / "run" / "confserver.ready"
    ready.unlink(missing_ok=True)
    service = Service("confserver", [CONFSERVER_MODULE, "--data-dir", str(base / "confserver"),
                                     "--ready-file", str(ready), "--listen", listen],
                      log_path=logs / "confserver.log")
    service.start(env)
    services.append(service)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not (ready.exists() and ready.read_text().endswith("\n")):
        if service.process.poll() is not None or time.monotonic() > deadline:
            reason = _final_error(service.log_path, ERROR_PREFIX)
            raise UserError(f"the confserver did not start: {reason} (log: {service.log_path})" if reason else
                            f"the confserver did not start: see {service.log_path}")
        time.sleep(0.05)
    address = ready.read_text().strip()
    # A restarted confserver must come back where every service and worker knows it to be.
    service.argv[service.argv.index("--listen") + 1] = address
    return f"ramen://{address}"


def _start_httpd(args, env: dict, logs: Path, services: list[Service]) -> Service:
    from ramen.httpd.service import url_file
    url_file().unlink(missing_ok=True)
    argv = ["ramen.httpd.service", "--site", args.site]
    if args.httpd_listen:
        argv += ["--listen", args.httpd_listen]
    if args.httpd_auth:
        argv += ["--auth", str(_absolute(args.httpd_auth))]
    service = Service("httpd", argv, log_path=logs / "httpd.log", env=arrow_on_the_c_allocator(env))
    service.start(env)
    services.append(service)
    return service


def _httpd_url(httpd: Service) -> str | None:
    """The page's URL once httpd listens; None, with a warning, when it could not (the rest runs on)."""
    from ramen.httpd.service import url_file
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and httpd.process.poll() is None:
        try:
            text = url_file().read_text().strip()
        except OSError:
            text = ""
        if text:
            return text
        time.sleep(POLL_INTERVAL_S)
    reason = _final_error(httpd.log_path, ERROR_PREFIX)
    print(f"ramen: warning: httpd did not start: {reason or 'see ' + str(httpd.log_path)}", file=sys.stderr)
    return None


def _probe(confserver: Service, url: str):
    """Probe the confserver we run (through its committer): its signs of life."""
    from confserver.probe import Prober
    from confserver.url import parse_url
    address = parse_url(url)
    prober = Prober(address.host, address.port).start()
    confserver.liveness, confserver.stuck_after_s = prober, PROBE_STUCK_AFTER_S
    return prober


def _stop_left_over(supervisor: Service, env: dict, site: str, url: str | None) -> None:
    """The supervisor did not stop cleanly (it had died, or was killed before it could stop its
    children): the workers and replayers it ran live on in sessions of their own. A successor
    adopts them, as a restarted supervisor would, and stops them, before the confserver goes.
    With the confserver gone (another site's, stopped first) no successor could start: they are
    left to _stop_instance_processes, which stops them by their instance's token."""
    status = supervisor.process.returncode
    if url is not None and not _reachable(url):
        print(f"ramen: the supervisor had died (status {status}) and the confserver at {url} is unreachable; "
              f"stopping what it left running without it", file=sys.stderr, flush=True)
        return
    print(f"ramen: the supervisor had died (status {status}); stopping what it left running",
          file=sys.stderr, flush=True)
    with open(supervisor.log_path, "ab") as log:
        try:
            subprocess.run([sys.executable, "-m", "supervisor.service", "--site", site, "--stop-left-over"], env=env,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=LEFT_OVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"ramen: could not stop what the supervisor left in {LEFT_OVER_TIMEOUT_S:g} s; see "
                  f"{supervisor.log_path}", file=sys.stderr, flush=True)


def _reachable(url: str) -> bool:
    """Whether one of the confserver's hosts accepts a connection."""
    from confserver.url import parse_url
    from ramen.listen import accepts
    return any(accepts(host, port, CONFSERVER_CONNECT_TIMEOUT_S) for host, port in parse_url(url).hosts)


def _final_error(log_path: Path, prefix: str) -> str | None:
    """The one-line error a process ended its log with, without `prefix`; None when its last line
    is something else. Only the last line: logs are appended to, run after run."""
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1].removeprefix(prefix) if lines and lines[-1].startswith(prefix) else None


def _user_args():
    import argparse
    return argparse.Namespace(confserver=None, identity=None, default_identity="user", token=None)


def _load_programs(client, files: list[str]) -> None:
    from ramen.cli.run import load_program
    for file in files:
        program, outcome = load_program(client, file, replace=True)
        print(f"ramen: {outcome} {program.name} ({len(program.functions)} functions)", file=sys.stderr)


def _keep_running(keeper: Keeper, stopping: list, turns: _Turns) -> None:
    """Keep the services running, and kill and restart the stuck, until asked to stop."""
    while not stopping:
        if turns.error is not None:
            raise turns.error
        keeper.do_work(time.monotonic())
        time.sleep(POLL_INTERVAL_S)


class _Turns:
    """Spark's turns (start it when wanted, announce it once up) and netd's (start it when wanted)
    on a thread of their own: they call the confserver, and a call to a stuck one would hold up the
    keeper that is to kill it."""

    def __init__(self, spark: SparkService, netd: _NetdOnDemand | None, confserver: Service | None):
        self.spark = spark
        self.netd = netd
        self.confserver = confserver
        self.error: UserError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turns", daemon=True)

    def start(self) -> _Turns:
        self._thread.start()
        return self

    def _run(self) -> None:
        from confserver import ConfError
        while not self._stop.wait(POLL_INTERVAL_S):
            if self.confserver is not None and not self.confserver.showed_life_within(
                    time.monotonic(), CONFSERVER_ANSWERED_WITHIN_S):
                continue
            try:
                self.spark.poll()
                if self.netd is not None:
                    self.netd.poll()
            except ConfError as e:  # the confserver went away meanwhile: next turn
                print(f"ramen: {e}; trying again", file=sys.stderr, flush=True)
            except UserError as e:  # Spark is wanted but cannot start: `ramen start` ends with it
                self.error = e
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(STOP_GRACE_S)


def _daemonize(args, base: Path, run_dir: Path) -> int:
    """Run `ramen start` (without --daemon) detached, and return once it is ready or has failed."""
    argv = [sys.executable, "-m", "ramen.cli.main", "start", "--dir", str(base), "--site", args.site,
            "--listen", args.listen,
            *(["--confserver", args.confserver] if args.confserver else []),
            *(["--spark", args.spark] if args.spark else []),
            *(["--spark-staging", args.spark_staging] if args.spark_staging else []),
            *([] if args.httpd else ["--no-httpd"]),
            *(["--httpd-listen", args.httpd_listen] if args.httpd_listen else []),
            *(["--httpd-auth", str(_absolute(args.httpd_auth))] if args.httpd_auth else []),
            *({True: ["--netd"], False: ["--no-netd"], None: []}[args.netd]), "--netd-listen", args.netd_listen,
            *[word for network in args.netd_allow for word in ("--netd-allow", str(network))],
            *(["--netd-setup-key", str(_absolute(args.netd_setup_key))] if args.netd_setup_key else []),
            *map(str, map(_absolute, args.programs))]
    (run_dir / READY_FILE).unlink(missing_ok=True)
    log_path = base / "logs" / "start.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
    while not (run_dir / READY_FILE).exists():
        if process.poll() is not None or time.monotonic() > deadline:
            own = _final_error(log_path, f"{ERROR_PREFIX}start: ")  # the foreground start's own error
            if own is not None:
                raise UserError(own)
            tail = log_path.read_text().strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"ramen did not start: {tail[0]} (see {log_path})")
        time.sleep(0.05)
    print(f"ramen: running in the background from {base} (pid {process.pid}); `ramen stop --dir {base}` stops it")
    if args.httpd:
        from ramen.httpd.service import url_file
        try:
            print(f"ramen: dashboards at {url_file().read_text().strip()}")
        except OSError:  # httpd did not start: the foreground start said why, in its log
            print(f"ramen: warning: httpd did not start (see {base / 'logs' / 'httpd.log'})", file=sys.stderr)
    return 0


def _absolute(path: str) -> Path:
    return Path(path).resolve()


def run_stop(args) -> int:
    """Stop `ramen start` (which stops its services in order), then whatever of its instance is
    still running: what a supervisor that died left, or everything if `ramen start` itself was
    killed."""
    base = _base(args)
    run_dir = base / "run"
    pid_file = run_dir / PID_FILE
    instance_file = run_dir / INSTANCE_FILE
    token = instance_file.read_text().strip() if instance_file.exists() else None
    written = pid_file.read_text().strip() if pid_file.exists() else ""
    # Only the holder of the pid file's lock is `ramen start`: the pid written in a stale file may
    # have been given to a stranger since, who must not be signalled.
    pid = _ramen_start_pid(pid_file)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 4 * STOP_GRACE_S
        while _alive(pid):
            if time.monotonic() > deadline:
                raise UserError(f"ramen (pid {pid}) did not stop within {4 * STOP_GRACE_S:g} s")
            time.sleep(0.1)
        print(f"ramen: stopped (pid {pid})")
        _stop_instance_processes(token)
    elif not _stop_instance_processes(token):
        pid_file.unlink(missing_ok=True)
        raise UserError(f"ramen is not running from {base} " +
                        (f"(stale {pid_file}: pid {written} is not ramen's)" if written else f"(no {pid_file})"))
    _remove_result_logs()
    for path in (pid_file, instance_file, run_dir / READY_FILE):
        path.unlink(missing_ok=True)
    return 0


def _stop_instance_processes(token: str | None) -> list[int]:
    """Stop every process still running with this instance's token (what a dead supervisor, or a
    dead `ramen start`, left); returns their pids."""
    if not token:
        return []
    stopped: list[int] = []
    # Again until none is left: a supervisor stopped with its workers may have started one more
    # (it saw a worker die before it got its own SIGTERM), after the processes were listed.
    for _ in range(STOP_ROUNDS):
        left = [pid for pid in instance_processes(token) if pid not in stopped]
        if not left:
            break
        commands = {pid: command_line(pid) for pid in left}
        print(f"ramen: stopping {len(left)} processes left running: " +
              "; ".join(f"pid {pid} ({commands[pid][:80]})" for pid in left), file=sys.stderr, flush=True)
        # The confserver last, as `ramen start` stops them: the others let go of their keys as they
        # stop, and waited for it until they were killed.
        confservers = [pid for pid in left if f"-m {CONFSERVER_MODULE} " in commands[pid] + " "]
        killed = stop_processes([pid for pid in left if pid not in confservers], STOP_GRACE_S)
        killed += stop_processes(confservers, STOP_GRACE_S)
        if killed:
            print(f"ramen: killed {', '.join(map(str, killed))} after {STOP_GRACE_S:g} s", file=sys.stderr)
        stopped += left
    return stopped


def _remove_result_logs() -> None:
    """Nobody reads a replay's result once its ramen is stopped: a client killed before it could
    remove its log left it here (a client still reading has it mapped: removing it is harmless)."""
    for path in paths.recipient_logs_dir().glob(f"*{paths.LOG_SUFFIX}"):
        path.unlink(missing_ok=True)


def _ramen_start_pid(pid_file: Path) -> int | None:
    """The pid of the `ramen start` holding `pid_file`'s lock, None when nobody holds it."""
    return holders([pid_file]).get(pid_file)


def _alive(pid: int) -> bool:
    return pid > 0 and running(pid)
