"""Asking for a replay and reading its result: the client side of docs/runtime.md.

`ramen replay` uses it, and so can any program: plan the replay, take a channel, create the
recipient log buffer and subscribe to it, write `replays/<channel>` (ephemeral, so it goes if this
client dies), then read Arrow batches until the target's END_OF_REPLAY. The confserver client is
passed in (ramen does not import the confserver package); it only needs next_sequence, create,
glob, discard, delete_tree and watch.

With `relay`, no log: the serving site's supervisor reads the target's result from a log of its own
and writes it to `replay-results/<channel>/...` (ramen/replay/contract.py, ResultPart), which this
client watches, so that it may run on a host that cannot map the site's files.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from ramen import keyspace, paths
from ramen.clocks import SYSTEM_CLOCK, Clock
from ramen.archive.coverage import archive_coverage
from ramen.archive.coverage_key import ArchiveCoverage
from ramen.archive.errors import ArchiveError
from ramen.message import KIND_END_OF_REPLAY, KIND_TUPLES, decode_header
from ramen.program import Program
from ramen.replay import summary as summaries
from ramen.replay.contract import (DEFAULT_REPLAY_TIMEOUT_S, RESULT_MESSAGE_LENGTH, ContractError, ReplayRequest,
                                   ResultEnd, ResultPart, Summary)
from ramen.replay.plan import ReplayGapError, ReplayPlan, newest_end_us, plan_replay, without_newest_tail
from ramen.transport import BackoffIdleStrategy, CountersFile, FragmentAssembler, Image, LogBuffer, LogBufferParams
from ramen.transport.defaults import IPC_MTU_LENGTH
from ramen.tuples import decode_tuples

log = logging.getLogger(__name__)

SUPERVISOR_GRACE_S = 5.0
"""How long a replay waits for a supervisor of its site to show up (its ephemeral key) before it
fails: `ramen start` restarts a dead one within seconds, and a new one re-announces itself at once;
no supervisor beyond that means nobody will ever start the replayers."""
#: Fragments taken from the recipient log per poll.
FRAGMENT_LIMIT = 256
RECIPIENT_TERM_LENGTH = 16 * 1024 * 1024
IDLE_MIN_PARK_S = 0.001
IDLE_MAX_PARK_S = 0.005
"""A reader of a replay's result sleeps as soon as its log is empty (no spinning, no yielding),
first for IDLE_MIN_PARK_S, then longer, up to IDLE_MAX_PARK_S: the rows come a window at a time,
milliseconds apart, and the core a waiting reader spins on is one the target needs. Each wake-up
costs 20-40 µs of CPU on this machine's VMs (a sleep's own cost), so 20 readers in one process
waking every 50 µs to 2 ms took 0.4-0.46 s of CPU a replay; at 1-5 ms, 0.22-0.34 s, and the 20
replays took 1.0-1.2 s where one takes 0.95 s (1.15-1.24 s before)."""
RELAY_WAIT_S = 0.05
"""A relayed replay's client waits this long for a result key before it looks at the request, its
supervisor and its timeout again (the keys themselves wake it at once)."""


def recipient_params(channel: int) -> LogBufferParams:
    """The log buffer a replay's result is written to: the client's own, or a relaying supervisor's."""
    return LogBufferParams(term_length=RECIPIENT_TERM_LENGTH, mtu_length=IPC_MTU_LENGTH,
                           session_id=channel, stream_id=channel)


LOST_REPLAY_ATTEMPTS = 2
"""Times a consumer asks for a replay that was lost (ReplayFailed.lost: a replayer or worker on its
path died under it) before it reports the loss: httpd's renders, and `ramen replay` while it has
written no row."""


class ReplayFailed(Exception):
    """The replay could not deliver its result; the message is one line for the user: a damaged
    archive met while planning, or the `error` a replayer (naming the file and offset of the damage
    it met) or the supervisor put into the request. `lost`: a process on its path died under it,
    so the same replay asked again may succeed."""

    def __init__(self, message: str, *, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


class ReplayCancelled(Exception):
    """Its reader stopped it (Replay.batches' `stop`): not a failure of the replay."""


class SupervisorPresence:
    """Whether a supervisor of `site` runs, from its ephemeral key (ramen.liveness.SupervisorAlive),
    watched so that asking costs no call to the confserver."""

    def __init__(self, client, site: str, *, clock: Clock = SYSTEM_CLOCK, grace_s: float = SUPERVISOR_GRACE_S):
        self.site = site
        self.clock = clock
        self.grace_s = grace_s
        self._watch = client.watch(keyspace.supervisor_alive_key(site))
        self._absent_since: float | None = clock.seconds()
        """Since when no supervisor key was seen; None while there is one."""

    @property
    def seen(self) -> bool:
        """Whether the supervisor's key was there at the latest check()."""
        return self._absent_since is None

    def check(self) -> None:
        """ReplayFailed, in one line, once no supervisor has been there for the grace period."""
        now = self.clock.seconds()
        for event in self._watch.drain():
            if event.kind.value in ("existing", "created", "updated"):
                self._absent_since = None
            elif event.kind.value == "deleted" and self._absent_since is None:
                self._absent_since = now
        if self._absent_since is not None and now - self._absent_since >= self.grace_s:
            raise ReplayFailed(f"no supervisor of site {self.site} is running: start ramen with `ramen start`")

    def close(self) -> None:
        self._watch.close()


@dataclass
class ReplayProgress:
    rows: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)
    first_row_s: float | None = None


def _placed(name: str, programs: dict[str, Program]) -> str | None:
    """The site function `name` is placed on; None: every site (or an unknown function, which
    plan_replay names)."""
    program, _, function = name.partition("/")
    if program not in programs or function not in programs[program]:
        return None
    return programs[program].function(function).site


def _check_site(name: str, programs: dict[str, Program], site: str, target: str) -> None:
    """ReplayFailed unless function `name` runs on `site`: the site's workers compute it."""
    placed = _placed(name, programs)
    if placed not in (None, site):
        raise ReplayFailed(f"{name} runs on site {placed}, not {site}: replay {target} with --site {placed} "
                           f"--via-confserver (a replay computes on one site; only its sources may be "
                           f"archived on others)")


def replay_coverage(client, programs: dict[str, Program], site: str, *, relay: bool = False) -> dict:
    """What the archives can replay, per function: the site's own (its files, or, relayed, what its
    archiver publishes), and for each function placed on another site, what that site's archiver
    publishes (a site that publishes none covers nothing)."""
    coverage = dict(published_coverage(client, site) if relay else _local_coverage(site))
    others = {placed for program in programs.values() for f in program if (placed := f.site) not in (None, site)}
    for other in sorted(others):
        try:
            theirs = published_coverage(client, other)
        except ReplayFailed as e:
            log.info("%s", e)
            continue
        coverage.update({name: intervals for name, intervals in theirs.items() if _placed(name, programs) == other})
    return coverage


def source_sites(plan: ReplayPlan, programs: dict[str, Program], site: str) -> dict[str, str]:
    """The plan's sources placed on sites other than `site`, by name: replayed there."""
    return {name: placed for name in plan.sources if (placed := _placed(name, programs)) not in (None, site)}


def _local_coverage(site: str) -> dict:
    try:
        return archive_coverage(paths.archive_dir(site))
    except ArchiveError as e:  # a damaged catalog: nothing can be planned from it
        raise ReplayFailed(str(e)) from None


def published_coverage(client, site: str) -> dict:
    """What the site's archiver says its archive covers (ramen/archive/coverage_key.py): a relayed
    replay's client may run where the archive's files are not."""
    key = keyspace.archive_coverage_key(site)
    entry = client.get_or_none(key)
    if entry is None:
        raise ReplayFailed(f"site {site} publishes no archive coverage ({key}): is its archiver running?")
    try:
        return ArchiveCoverage.from_value(entry.value, key).intervals()
    except ContractError as e:
        raise ReplayFailed(str(e)) from None


class Replay:
    """One replay of `target` over [since_us, until_us), from request to result."""

    def __init__(self, client, programs: dict[str, Program], target: str, since_us: int, until_us: int, *,
                 site: str = keyspace.DEFAULT_SITE, timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
                 no_merge: bool = False, strict: bool = True, summary: Summary | None = None,
                 relay: bool = False, clock: Clock = SYSTEM_CLOCK):
        """`strict` False: replay what the archives cover of the range (plan_replay's leniency);
        `plan.uncovered` names what they do not. `summary`: the result is the target's buckets
        (ramen/replay/summary.py), not its rows; SummaryError if the target cannot have them.
        `relay`: the result comes through the confserver, not a log of this host."""
        self.client = client
        self.clock = clock
        self._supervisors: list[SupervisorPresence] = []
        self.site = site
        self.timeout_s = timeout_s
        self.no_merge = no_merge
        self.relay = relay
        _check_site(target, programs, site, target)
        self.plan: ReplayPlan = plan_replay(target, since_us, until_us, programs,
                                            replay_coverage(client, programs, site, relay=relay), strict=strict)
        for name in self.plan.workers:
            _check_site(name, programs, site, target)
        self.source_sites = source_sites(self.plan, programs, site)
        """Sources archived on other sites, whose supervisors replay them for us (ReplayRequest.source_sites)."""
        program, _, function = target.partition("/")
        self.function = programs[program].function(function)
        self.summary = summary
        if summary is not None:
            summaries.check(summary, self.function)
        self.schema: pa.Schema = summaries.schema(summary, self.function) if summary else self.function.schema
        self.channel: int | None = None
        self.progress = ReplayProgress()
        self._log: LogBuffer | None = None
        self._image: Image | None = None
        self._counters: CountersFile | None = None
        self._watch = None
        self._batches: list[pa.RecordBatch] = []
        self._ended = False
        self._results = None
        """relay: the watch of replay-results/<channel>/*."""
        self._parts: dict[int, ResultPart] = {}
        self._next_part = 0
        self._end: ResultEnd | None = None
        self._stream = bytearray()
        """relay: the result's bytes received and not yet decoded (a message's beginning)."""

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Take a channel, subscribe to the recipient log (relay: watch the result keys), then ask
        (so nothing can be missed)."""
        self.channel = self.client.next_sequence(keyspace.REPLAY_CHANNEL_SEQUENCE)
        if self.relay:
            self._results = self.client.watch(f"{keyspace.replay_results_key(self.channel)}/*")
        else:
            recipient = paths.recipient_log(self.channel)
            recipient.parent.mkdir(parents=True, exist_ok=True)
            self._log = LogBuffer.create(recipient, recipient_params(self.channel))
            self._counters = CountersFile.open(paths.counters_path())
            self._image = Image(self._log, self._counters, name=f"replay {self.channel} client")
            self._assembler = FragmentAssembler(self._on_message, hand_over=True)
        key = keyspace.replay_key(self.channel)
        self._supervisors = [SupervisorPresence(self.client, site, clock=self.clock)
                             for site in sorted({self.site, *self.source_sites.values()})]
        self._watch = self.client.watch(key)
        self.client.create(key, self.request(), ephemeral=True)
        log.info("replay %d of %s requested", self.channel, self.plan.target)

    def request(self) -> dict:
        recipient = "" if self.relay else str(paths.recipient_log(self.channel))
        return ReplayRequest(self.plan.target, self.plan.since_us, self.plan.until_us, self.plan,
                             recipient, created_us=time.time_ns() // 1000,
                             timeout_s=self.timeout_s, no_merge=self.no_merge, pid=os.getpid(),
                             summary=self.summary, site=self.site, relay=self.relay,
                             source_sites=self.source_sites).to_value()

    def batches(self, on_progress: Callable[[ReplayProgress], None] | None = None, *,
                stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        """The result's batches as they arrive, until the target's END_OF_REPLAY; ReplayCancelled
        once `stop` is set (looked at before each poll): the caller closes the replay."""
        if self.relay:
            yield from self._relayed_batches(on_progress, stop)
            return
        idle = BackoffIdleStrategy(min_park_s=IDLE_MIN_PARK_S, max_park_s=IDLE_MAX_PARK_S)
        deadline = time.monotonic() + self.timeout_s
        while not self._ended:
            self._check_stop(stop)
            work = self._image.poll(self._assembler.on_fragment, FRAGMENT_LIMIT)
            if self._batches:
                out, self._batches = self._batches, []
                yield from out
                if on_progress is not None:
                    on_progress(self.progress)
            if work == 0:
                self._check_request()
                self._check_supervisors()
                if time.monotonic() > deadline:
                    raise ReplayFailed(f"replay {self.channel} of {self.plan.target} did not finish "
                                       f"within {self.timeout_s:g} s")
            idle.idle(work)
        yield from self._batches
        self._batches = []

    def _relayed_batches(self, on_progress: Callable[[ReplayProgress], None] | None,
                         stop: threading.Event | None) -> Iterator[pa.RecordBatch]:
        """The result's batches from replay-results/<channel>/<n> in part order, until `end`."""
        deadline = time.monotonic() + self.timeout_s
        while not self._ended:
            self._check_stop(stop)
            event = self._results.next(RELAY_WAIT_S)
            events = ([event] if event is not None else []) + self._results.drain()
            for event in events:
                self._on_result_key(event)
            while self._next_part in self._parts:
                self._take_part(self._parts.pop(self._next_part))
                self._next_part += 1
            if self._end is not None:
                if self._end.error:
                    raise ReplayFailed(self._end.error)
                if self._next_part == self._end.parts:
                    self._ended = True
            if self._batches:
                out, self._batches = self._batches, []
                yield from out
                if on_progress is not None:
                    on_progress(self.progress)
            if not events and not self._ended:
                self._check_request()
                self._check_supervisors()
                if time.monotonic() > deadline:
                    raise ReplayFailed(f"replay {self.channel} of {self.plan.target} did not finish "
                                       f"within {self.timeout_s:g} s")
        if self._stream:
            raise ReplayFailed(f"replay {self.channel}: the relayed result ends inside a message "
                               f"({len(self._stream)} bytes left over)")

    def _on_result_key(self, event) -> None:
        if event.entry is None or event.kind.value not in ("existing", "created", "updated"):
            return
        name = event.key.rpartition("/")[2]
        try:
            if name == "end":
                self._end = ResultEnd.from_value(event.entry.value, event.key)
            elif name.isdigit():
                self._parts[int(name)] = ResultPart.from_value(event.entry.value, event.key)
        except ContractError as e:
            raise ReplayFailed(str(e)) from None

    def _take_part(self, part: ResultPart) -> None:
        """Append a part's bytes to the stream and decode every message now whole."""
        try:
            self._stream += base64.b64decode(part.data, validate=True)
        except binascii.Error as e:
            raise ReplayFailed(f"replay {self.channel}: a relayed part is not base64: {e}") from None
        size = RESULT_MESSAGE_LENGTH.size
        offset = 0
        while len(self._stream) - offset >= size:
            (length,) = RESULT_MESSAGE_LENGTH.unpack_from(self._stream, offset)
            if len(self._stream) - offset - size < length:
                break
            self._on_message(bytes(self._stream[offset + size:offset + size + length]), 0, length, None)
            offset += size + length
        del self._stream[:offset]

    def _on_message(self, message, offset: int, length: int, header) -> None:
        """A whole message of its own (the assembler hands it over): the batch can keep it."""
        ramen_header = decode_header(message)
        if ramen_header is None or ramen_header.channel != self.channel:
            return
        if ramen_header.kind == KIND_TUPLES:
            batch = decode_tuples(message, self.schema)
            self._batches.append(batch)
            self.progress.rows += batch.num_rows
            self.progress.batches += 1
            if self.progress.first_row_s is None and batch.num_rows:
                self.progress.first_row_s = time.monotonic() - self.progress.started
        elif ramen_header.kind == KIND_END_OF_REPLAY:
            self._ended = True

    def _check_request(self) -> None:
        """Fail at once when the supervisor marked the replay failed, or it vanished unfinished."""
        for event in self._watch.drain():
            if event.entry is not None:
                try:
                    request = ReplayRequest.from_value(event.entry.value, event.key)
                except ContractError as e:
                    raise ReplayFailed(str(e)) from None
                if request.error:
                    raise ReplayFailed(request.error, lost=request.lost)
            if event.kind.value == "deleted" and not self.relay:
                # The target deletes the key after writing END_OF_REPLAY: read what is left first.
                # (Relayed, the supervisor then writes the end key, with an error if there was no end.)
                self._image.poll(self._assembler.on_fragment, 1 << 30)
                if not self._ended:
                    raise ReplayFailed(f"replay {self.channel} of {self.plan.target} was torn down "
                                       "before it finished")

    def _check_stop(self, stop: threading.Event | None) -> None:
        if stop is not None and stop.is_set():
            raise ReplayCancelled(f"replay {self.channel} of {self.plan.target} cancelled: nobody waits for it")

    def _check_supervisors(self) -> None:
        """ReplayFailed once the site's supervisor, or that of a site replaying a source for it, is gone."""
        for supervisor in self._supervisors:
            supervisor.check()

    def close(self) -> None:
        """Withdraw the request (if still there) and remove the recipient log (relay: the result keys)."""
        if self._watch is not None:
            self._watch.close()
        if self._results is not None:
            self._results.close()
        for supervisor in self._supervisors:
            supervisor.close()
        if self.channel is not None:
            key = keyspace.replay_key(self.channel)
            try:
                self.client.discard(key)
            except Exception as e:  # noqa: BLE001 - cleanup must not hide the result or the real error
                log.warning("could not delete %s: %s", key, e)
            if self.relay:
                results = keyspace.replay_results_key(self.channel)
                try:
                    self.client.delete_tree(results)
                except Exception as e:  # noqa: BLE001 - as above; the supervisor deletes them after the timeout
                    log.warning("could not delete %s: %s", results, e)
        if self._image is not None:
            self._image.close()
        if self._log is not None:
            self._log.close()
            paths.recipient_log(self.channel).unlink(missing_ok=True)
        if self._counters is not None:
            self._counters.close()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def replay_to_newest(client, programs: dict[str, Program], target: str, since_us: int, until_us: int,
                     **options) -> Replay:
    """A Replay of [since_us, until_us), or, when the archives stop short of until_us, up to where
    they reach: the newest tuples are still on their way to the disk, and a gap of a second at the
    end of a range that ends "now" is not worth an error, nor a warning. Any other gap is one (or,
    not strict, a part of `plan.uncovered`)."""
    try:
        replay = Replay(client, programs, target, since_us, until_us, **options)
    except ReplayGapError as e:
        if (end_us := newest_end_us(e, since_us, until_us)) is None:
            raise
        return Replay(client, programs, target, since_us, end_us, **options)
    replay.plan = without_newest_tail(replay.plan, until_us)
    return replay
