"""A real Spark standalone cluster for tests and benches, from the jars that ship in pyspark: a
master and one worker (`bin/spark-class ...deploy.master.Master` / `...deploy.worker.Worker`;
pyspark has no sbin scripts for them), and a Spark Connect server on them with `--master
spark://...` and Spark's default driver memory (1 GiB), which is what an operator's
`sbin/start-connect-server.sh --master spark://...` runs.

Every process runs in the foreground, on 127.0.0.1, logging to its own file under `base_dir`, and
every wait is bounded. The worker can be killed (a lost executor) and the cluster closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Self

from ramen.spark.defaults import LOCAL_HOST
from ramen.spark.server import free_port, remote_url, server_command, server_env, spark_home, wait_ready

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
WORKER_MEMORY = "3g"
"""What the issue's operator gave the worker: its executors share it."""
WORKER_CORES = 2
CLUSTER_TIMEOUT_S = 120.0
"""Two JVMs, then a third (the Connect server), cold on 2 cores."""
POLL_S = 0.25


class StandaloneCluster:
    """start() returns once the worker has registered with the master and Connect accepts clients."""

    def __init__(self, base_dir: str | Path | None = None, *, worker_memory: str = WORKER_MEMORY,
                 driver_memory: str | None = None) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="ramen-spark-cluster-"))
        self.worker_memory = worker_memory
        self.driver_memory = driver_memory
        self.master_port, self.master_ui_port = free_port(), free_port()
        self.worker_ui_port = free_port()
        self.connect_port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def master_url(self) -> str:
        return f"spark://{LOCAL_HOST}:{self.master_port}"

    @property
    def remote(self) -> str:
        return remote_url(self.connect_port)

    def log(self, name: str) -> Path:
        return self.base_dir / f"{name}.log"

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        env = server_env()
        env["SPARK_LOG_DIR"] = env["SPARK_PID_DIR"] = str(self.base_dir)
        env["SPARK_WORKER_DIR"] = str(self.base_dir / "work")
        with open(self.log(name), "ab") as log:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.processes[name] = process
        return process

    def start(self) -> Self:
        spark_class = str(spark_home() / "bin" / "spark-class")
        self._spawn("master", [spark_class, MASTER_CLASS, "--host", LOCAL_HOST, "--port", str(self.master_port),
                               "--webui-port", str(self.master_ui_port)])
        self.start_worker()
        self._spawn("connect", server_command(self.connect_port, driver_memory=self.driver_memory,
                                              master=self.master_url))
        wait_ready(self.connect_port, self.processes["connect"], self.log("connect"), timeout_s=CLUSTER_TIMEOUT_S)
        return self

    def start_worker(self) -> None:
        spark_class = str(spark_home() / "bin" / "spark-class")
        self._spawn("worker", [spark_class, WORKER_CLASS, "--host", LOCAL_HOST, "--webui-port",
                               str(self.worker_ui_port), "--memory", self.worker_memory, "--cores",
                               str(WORKER_CORES), "--work-dir", str(self.base_dir / "work"), self.master_url])
        self.wait_workers(1)

    def master_state(self) -> dict:
        with urllib.request.urlopen(f"http://{LOCAL_HOST}:{self.master_ui_port}/json/", timeout=2) as answer:
            return json.load(answer)

    def wait_workers(self, alive: int) -> None:
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with {process.returncode}: see {self.log(name)}")
            try:
                workers = [w for w in self.master_state().get("workers", []) if w.get("state") == "ALIVE"]
                if len(workers) >= alive:
                    return
            except (OSError, ValueError):
                pass  # the master's UI is not up yet, or still answers with its HTML page
            if time.monotonic() > deadline:
                raise RuntimeError(f"{alive} Spark worker(s) not registered within {CLUSTER_TIMEOUT_S:g} s: "
                                   f"see {self.base_dir}")
            time.sleep(POLL_S)

    def kill(self, name: str) -> None:
        """SIGKILL one process and its group: a worker with the executors it started, as when its
        host goes."""
        process = self.processes.get(name)
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def close(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    self.kill(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # what it started (a worker's executors)
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
