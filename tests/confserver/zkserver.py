"""A real ZooKeeper server for tests: one JVM on a free 127.0.0.1 port with a temporary data dir.

It can be stopped (SIGTERM), killed (SIGKILL, as a crash) and started again on the same port and
data dir, which is what the crash-recovery tests need. Debian's zookeeper package provides the jar.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
SLF4J_JAR = Path("/usr/share/java/slf4j-simple.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
#: A short tick lets clients ask for sessions as short as 2 ticks (1 s), so tests of a dead
#: client's ephemeral keys and locks wait about a second or two, not ZooKeeper's default 4 s.
TICK_MS = 500
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
RUOK_POLL_S = 0.1
NOT_SERVING = "not currently serving requests"


def missing_prerequisite() -> str | None:
    """Why a ZooKeeper server cannot be started here, or None if it can."""
    if shutil.which("java") is None:
        return "java is not installed (apt-get install zookeeper brings it)"
    if not ZOOKEEPER_JAR.exists():
        return f"{ZOOKEEPER_JAR} is absent (apt-get install -y --no-install-recommends zookeeper)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter_word(port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send one of ZooKeeper's four-letter commands and return the answer ('' if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    """A standalone ZooKeeper on 127.0.0.1; start() returns once it answers `ruok` with `imok`."""

    main_class = MAIN_CLASS

    def __init__(self, base_dir: str | os.PathLike | None = None, tick_ms: int = TICK_MS):
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="ramen-zk-"))
        self.data_dir = self.base_dir / "data"
        self.config = self.base_dir / "zoo.cfg"
        self.log = self.base_dir / "zookeeper.log"
        self.tick_ms = tick_ms
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, root: str) -> str:
        return f"zk://{self.hosts}/{root}"

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text("\n".join([*self._config_lines(), ""]))

    def _config_lines(self) -> list[str]:
        return [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr",
            "maxClientCnxns=0",  # every test client connects from 127.0.0.1; the default caps at 60
        ]

    def start(self) -> ZooKeeperServer:
        if self.running:
            return self
        self.spawn()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.process.returncode}: see {self.log}")
            if self.serving():
                return self
            time.sleep(RUOK_POLL_S)
        self.kill()
        raise RuntimeError(f"zookeeper did not answer ruok within {START_TIMEOUT_S} s: see {self.log}")

    def spawn(self) -> None:
        """Start the JVM without waiting for it: an ensemble's members serve only once a quorum
        of them runs, so they are spawned together and waited for together."""
        self._write_config()
        classpath = f"{ZOOKEEPER_JAR}:{SLF4J_JAR}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", classpath, self.main_class, str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def serving(self) -> bool:
        """Whether it answers requests now (False while it is down, starting or electing)."""
        try:
            # ruok answers before the database is loaded; srvr says when requests are served.
            return (four_letter_word(self.port, "ruok") == "imok"
                    and NOT_SERVING not in four_letter_word(self.port, "srvr"))
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _end(self, sig: int) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def stop(self) -> None:
        """A clean shutdown (SIGTERM); ZooKeeper takes 2-3 s to exit."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """A crash (SIGKILL): whatever ZooKeeper acknowledged must survive it."""
        self._end(signal.SIGKILL)

    def restart(self) -> ZooKeeperServer:
        """Start again on the same port and data dir."""
        return self.start()

    def close(self) -> None:
        self.kill()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class TcpProxy:
    """Forwards 127.0.0.1:port to a server, and can cut every connection and refuse new ones
    (cut) until heal(): a network partition between one client and the server, which a test
    needs to change the tree behind a client's back or to let its session expire."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._guard = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._guard:
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept(); close() alone does not
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._guard:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def heal(self) -> None:
        self.start()

    close = cut
