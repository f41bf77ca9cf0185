"""The confserver backends the contract suite runs against, behind one small interface."""

from __future__ import annotations

from pathlib import Path

import confserver

#: Short, so tests about dead sessions finish quickly.
CLIENT_SESSION_TIMEOUT_S = 1.5
BACKENDS = ("builtin", "zk")


class Backend:
    name = ""
    url = ""
    auth_file: Path

    def client(self, identity: str | None = "admin", **kwargs) -> confserver.ConfClient:
        kwargs.setdefault("session_timeout_s", CLIENT_SESSION_TIMEOUT_S)
        return confserver.connect(self.url, identity=identity, auth_file=self.auth_file, **kwargs)

    def kill_and_restart(self) -> None:
        raise NotImplementedError


class BuiltinBackend(Backend):
    name = "builtin"

    def __init__(self, server):
        self.server = server
        self.auth_file = server.auth_file

    @property
    def url(self) -> str:
        return self.server.url

    def kill_and_restart(self) -> None:
        self.server.restart(hard=True)


class ZkBackend(Backend):
    name = "zk"

    def __init__(self, zookeeper, auth_file: Path, root: str = "contract"):
        self.zookeeper = zookeeper
        self.auth_file = auth_file
        self.url = zookeeper.url(root)

    def kill_and_restart(self) -> None:
        self.zookeeper.kill()
        self.zookeeper.restart()
