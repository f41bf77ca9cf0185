"""A real ZooKeeper server for tests: one JVM on a free 127.0.0.1 port with a temporary data dir.

It can be stopped (SIGTERM), killed (SIGKILL, as a crash) and started again on the same port and
data dir, which is what the crash-recovery tests need. Debian's zookeeper package provides the jar.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

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
        self.config.write_text("\n".join([
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr",
            "maxClientCnxns=0",  # every test client connects from 127.0.0.1; the default caps at 60
            "",
        ]))

    def start(self) -> ZooKeeperServer:
        if self.running:
            return self
        self._write_config()
        classpath = f"{ZOOKEEPER_JAR}:{SLF4J_JAR}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", classpath, MAIN_CLASS, str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.process.returncode}: see {self.log}")
            try:
                # ruok answers before the database is loaded; srvr says when requests are served.
                if (four_letter_word(self.port, "ruok") == "imok"
                        and NOT_SERVING not in four_letter_word(self.port, "srvr")):
                    return self
            except OSError:
                pass
            time.sleep(RUOK_POLL_S)
        self.kill()
        raise RuntimeError(f"zookeeper did not answer ruok within {START_TIMEOUT_S} s: see {self.log}")

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

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
