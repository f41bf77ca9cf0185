"""What `ramen start` does about Spark: point the deployment at one, starting the local one on demand.

- `--spark sc://host:port` (or $RAMEN_SPARK_REMOTE): that endpoint goes in the `spark/server` key;
  nothing is started here. `--spark-staging` names the staging store it shares with the workers
  (checked writable first); without one, rows reach it over Spark Connect.
- otherwise a local Spark Connect server starts the first time a program needs it: a program
  given to `ramen start` has a Spark function, or `ramen run` asked (the `spark/wanted` key). Its
  key is written once it accepts connections; if it dies, `ramen start` restarts it on the same
  port, so workers keep the URL and only retry.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from ramen import keyspace
from ramen.spark.contract import SparkServer
from ramen.spark.staging import StagingError, StagingStore
from ramen.spark.server import (accepts, java_missing, free_port, remote_url, server_command, server_env,
                                wait_ready)

SPARK_LOG = "spark.log"


def programs_need_spark(files: list[str]) -> bool:
    """Whether one of these program files has a Spark function (a file that does not parse is
    left for the loader to report)."""
    from ramen.program import ProgramError, load
    from ramen.program.model import ENGINE_SPARK
    for file in files:
        try:
            program = load(file, {})
        except (ProgramError, OSError):
            continue
        if any(f.engine == ENGINE_SPARK for f in program):
            return True
    return False


class SparkService:
    """The deployment's Spark as `ramen start` sees it; `service` is the local server, if started."""

    def __init__(self, client, base: Path, remote: str | None, make_service, *, staging: str | None = None,
                 cancelled: Callable[[], bool] = lambda: False) -> None:
        """`staging`: the store shared with Spark (a local server's default: DIR/spark/staging);
        `cancelled`: whether `ramen start` was asked to stop (a wait for Spark then ends at once)."""
        from ramen.cli.errors import UserError
        if staging:
            try:
                StagingStore(staging).check()
            except StagingError as e:
                raise UserError(str(e)) from None
        self.staging = staging
        self.client = client
        self.cancelled = cancelled
        self.base = base
        self.remote = remote
        self.make_service = make_service
        self.service = None
        self.port: int | None = None
        self.announced = False
        if remote:
            self._announce(remote, local=False)
        else:  # a key left by an earlier run names a server that is gone
            self.client.discard(keyspace.SPARK_SERVER)

    def start_local(self, *, wait: bool) -> None:
        """Start the local server (once); with wait, return when it accepts clients."""
        if self.remote or self.service is not None:
            if wait and self.service is not None:
                wait_ready(self.port, self.service.process, self.service.log_path, cancelled=self.cancelled)
                self.poll()
            return
        missing = java_missing()
        if missing:
            from ramen.cli.errors import UserError
            raise UserError(f"cannot start Spark for heavy functions: {missing}")
        self.port = free_port()
        self.service = self.make_service("spark", server_command(self.port), server_env(), SPARK_LOG)
        print(f"ramen: starting Spark Connect on 127.0.0.1:{self.port} (a cold start takes 10-20 s); "
              f"log in {self.service.log_path}", file=sys.stderr, flush=True)
        if wait:
            wait_ready(self.port, self.service.process, self.service.log_path, cancelled=self.cancelled)
            self.poll()

    def poll(self) -> None:
        """Called every turn of `ramen start`'s loop: start Spark if wanted, announce it once up."""
        if self.remote:
            return
        if self.service is None:
            if self.client.get_or_none(keyspace.SPARK_WANTED) is not None:
                self.start_local(wait=False)
            return
        if not self.announced and accepts(self.port):
            self._announce(remote_url(self.port), local=True)
            print(f"ramen: Spark Connect ready at {remote_url(self.port)}", file=sys.stderr, flush=True)

    def _announce(self, remote: str, *, local: bool) -> None:
        staging = self.staging
        if local and not staging:
            directory = self.base / "spark" / "staging"
            directory.mkdir(parents=True, exist_ok=True)
            staging = str(directory)
        self.client.set(keyspace.SPARK_SERVER, SparkServer(remote, local, staging).to_value())
        self.client.discard(keyspace.SPARK_WANTED)
        self.announced = True
