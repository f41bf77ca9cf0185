"""A real ZooKeeper ensemble for tests: three servers on 127.0.0.1, each with its own client,
quorum and election ports, data dir (with `myid`) and zoo.cfg listing all three.

Each member can be killed (SIGKILL, a crash) and restarted on the same ports and data dir, and
`leader()` says which one leads (from the four-letter word `srvr`), which is what failover tests
need. Every wait is bounded. Debian's zookeeper package provides the jar (see zkserver.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Self

from tests.confserver.zkserver import (
    RUOK_POLL_S,
    TICK_MS,
    ZooKeeperServer,
    four_letter_word,
    free_port,
)

QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
ENSEMBLE_SIZE = 3
#: Three JVMs starting at once on a small machine, then an election.
QUORUM_TIMEOUT_S = 60.0
#: Ticks a follower may take to connect to and sync with a leader (initLimit), and may lag
#: behind it (syncLimit); with 500 ms ticks, 5 s and 2.5 s.
INIT_LIMIT_TICKS = 10
SYNC_LIMIT_TICKS = 5
LEADER, FOLLOWER = "leader", "follower"


class EnsembleMember(ZooKeeperServer):
    """One server of the ensemble: a ZooKeeperServer run by QuorumPeerMain with peers."""

    main_class = QUORUM_MAIN_CLASS

    def __init__(self, myid: int, base_dir: Path, tick_ms: int):
        super().__init__(base_dir, tick_ms)
        self.myid = myid
        self.quorum_port = free_port()
        self.election_port = free_port()
        self.peers: list[EnsembleMember] = []

    def _write_config(self) -> None:
        super()._write_config()
        (self.data_dir / "myid").write_text(f"{self.myid}\n")

    def _config_lines(self) -> list[str]:
        return [*super()._config_lines(), f"initLimit={INIT_LIMIT_TICKS}", f"syncLimit={SYNC_LIMIT_TICKS}",
                *(f"server.{p.myid}=127.0.0.1:{p.quorum_port}:{p.election_port}" for p in self.peers)]

    def mode(self) -> str | None:
        """'leader' or 'follower' while it serves; None while it is down, starting or electing."""
        try:
            answer = four_letter_word(self.port, "srvr")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


class ZooKeeperEnsemble:
    """Three ZooKeeper servers on 127.0.0.1; start() returns once a quorum serves with a leader."""

    def __init__(self, base_dir: str | os.PathLike | None = None, tick_ms: int = TICK_MS,
                 size: int = ENSEMBLE_SIZE):
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="ramen-zk-ensemble-"))
        self.members = [EnsembleMember(i, self.base_dir / f"zk{i}", tick_ms)
                        for i in range(1, size + 1)]
        for member in self.members:
            member.peers = self.members

    @property
    def connect_string(self) -> str:
        return ",".join(m.hosts for m in self.members)

    def url(self, root: str) -> str:
        return f"zk://{self.connect_string}/{root}"

    def member(self, myid: int) -> EnsembleMember:
        return self.members[myid - 1]

    def start(self) -> ZooKeeperEnsemble:
        for member in self.members:
            if not member.running:
                member.spawn()
        self.wait_for_quorum(len(self.members))
        return self

    def wait_for_quorum(self, serving: int | None = None,
                        timeout_s: float = QUORUM_TIMEOUT_S) -> EnsembleMember:
        """Wait until one running member leads and the others that run follow (at least
        `serving` members in all, a majority by default); return the leader."""
        needed = serving if serving is not None else len(self.members) // 2 + 1
        deadline = time.monotonic() + timeout_s
        modes: dict[int, str | None] = {}
        while time.monotonic() < deadline:
            for member in self.members:
                if member.process is not None and member.process.poll() is not None:
                    raise RuntimeError(f"zookeeper {member.myid} exited with "
                                       f"{member.process.returncode}: see {member.log}")
            modes = {m.myid: m.mode() for m in self.members if m.running}
            leaders = [i for i, mode in modes.items() if mode == LEADER]
            in_quorum = [i for i, mode in modes.items() if mode in (LEADER, FOLLOWER)]
            if len(leaders) == 1 and len(in_quorum) == len(modes) and len(in_quorum) >= needed:
                return self.member(leaders[0])
            time.sleep(RUOK_POLL_S)
        raise RuntimeError(f"no quorum of {needed} within {timeout_s:g} s (modes by id: {modes}); "
                           f"see the logs under {self.base_dir}")

    def leader(self) -> EnsembleMember | None:
        """The member that says it leads now, None during an election."""
        leaders = [m for m in self.members if m.running and m.mode() == LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def kill(self, member: EnsembleMember) -> None:
        """SIGKILL: a crash, as of a host that vanished."""
        member.kill()

    def restart(self, member: EnsembleMember) -> EnsembleMember:
        """Start a killed member again on its ports and data dir; returns once it has rejoined
        (with every running member in the quorum), and then the leader."""
        if not member.running:
            member.spawn()
        return self.wait_for_quorum(sum(m.running for m in self.members))

    def heal(self) -> EnsembleMember:
        """Restart every member that is down; returns the leader once all serve."""
        for member in self.members:
            if not member.running:
                member.spawn()
        return self.wait_for_quorum(len(self.members))

    def close(self) -> None:
        for member in self.members:
            member.kill()
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
