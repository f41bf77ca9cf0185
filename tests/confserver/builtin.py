"""A real built-in confserver process for tests: start, SIGTERM, kill -9, restart on the same port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 15.0


class BuiltinServer:
    def __init__(self, data_dir: Path, *extra_args: str, module: str = "confserver.server"):
        self.data_dir = Path(data_dir)
        self.extra_args = extra_args
        self.module = module
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"ramen://127.0.0.1:{self.port}"

    @property
    def auth_file(self) -> Path:
        return self.data_dir / "auth.json"

    def start(self) -> BuiltinServer:
        ready = self.data_dir.parent / f"{self.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "--listen", f"127.0.0.1:{self.port}",
                 "--data-dir", str(self.data_dir), "--ready-file", str(ready), *self.extra_args],
                stdout=log, stderr=log)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (ready.exists() and ready.read_text().endswith("\n")):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"confserver did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        self.port = int(ready.read_text().strip().rpartition(":")[2])
        return self

    def kill(self) -> None:
        """kill -9: no chance to flush anything."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, *, hard: bool = True) -> None:
        self.kill() if hard else self.stop()
        self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and os.path.exists(f"/proc/{self.process.pid}")
