"""A worker's input logs: which it reads, for whom (live, replay channels), and their life cycle.

An input is wanted by its users (the live channel, replay channels) and read while one remains.
A log that does not exist yet is looked for again later: soon while a replay waits for it (its
replayer creates it within milliseconds), less often for a live parent that may not run for a long
while. Logs are joined at their producer position when first found: the supervisor writes the
replay keys before it spawns the replayers, and a replayer (like any publication) writes nothing
until a reader is connected. Another site's replayer's log, as netd rebuilds it here, is joined
at its first frame instead: netd holds the stream there until all its readers came (NetReceive.readers),
but it may have received a window of it before them. A log replaced at its path (another file: netd
rebuilding a remote parent's stream anew after a restart, a log recreated) is read anew, from its
first frame: the old file would never be written again, and its reader would wait for ever. For a
replay whose rows had begun in the old file that is a failure (`lost`): the new one, a stream
joined where its sender was then, misses what the old one had not received. So is another site's
replayer's log that ends before the END_OF_REPLAY of a channel read from it (its sender went
away), or that brings nothing new for RECEIVED_STALL_S while we have read all it holds (its stream
stalled between the two netds): a clear error rather than a replay that waits for its timeout.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ramen import paths
from ramen.message import LIVE_CHANNEL
from ramen.program.model import Function
from ramen.transport import (BlockAssembler, CountersFile, CountersFileError, Image, LogBuffer, LogBufferError,
                             Subscription)
from ramen.transport.frame import FRAME_ALIGNMENT
from ramen.transport.frame_walk import last_event_time_us, resume_position
from ramen.transport.position import index_by_term_count
from workers.defaults import LOG_WAIT_INTERVAL_S, POLL_BLOCK_LENGTH, RECEIVED_STALL_S, REPLAY_LOG_WAIT_INTERVAL_S

log = logging.getLogger(__name__)


@dataclass
class Input:
    """An input log: the schema its TUPLES decode with, and who needs it (live, replay channels)."""
    path: Path
    schema: pa.Schema
    event_time: str | None
    parent: str
    """The parent whose rows this log carries (this function itself for a pass-through source)."""
    shared: bool = False
    """A replayer's log: it carries the replay channels of every worker that reads it."""
    received: bool = False
    """Another site's replayer's log, rebuilt here by netd: read from its first frame."""
    users: set = field(default_factory=set)
    tagged: dict[int, set[int]] = field(default_factory=dict)
    """Tag -> the channels whose rows come tagged with it here (WorkerReplay.tags)."""
    log: LogBuffer | None = None
    image: Image | None = None
    assembler: BlockAssembler | None = None
    replaced: bool = False
    """The file it read was replaced: the new one is read from its first frame."""
    joined_at: int = 0
    """Where its image joined the log: a replaced log that had frames past it had rows for us."""
    ended: set[int] = field(default_factory=set)
    """The replay channels whose END_OF_REPLAY came through it."""
    progress: tuple[int, float] = (-1, 0.0)
    """(position, clock seconds when it was last seen to move) of a received log's image."""
    refused: bool = False
    """The counters file refused its reader a counter, and that was logged (Inputs._refused)."""
    rejoin_at: tuple[int, BlockAssembler] | None = None
    """Set after its writer dropped us: where to read on from, and the assembler of what we had
    read (Inputs._rejoin)."""
    written_before_us: int | None = None
    """The largest event time its log held when this worker joined it live (at its tail): rows up
    to there were written before the worker read, so windows that hold them may be missing some."""
    read_up_to_us: int | None = None
    """The largest event time of the live rows read from it (the worker keeps it: Worker._read_inputs)."""
    skipped: bool = False
    """Rows of its live stream were lost to us (the writer dropped us and overwrote what we had not
    read; a log replaced before we read all of it, or by one that goes on past where we were): the
    worker writes a GAP for them when its next live rows come (Worker._gap_for_skip)."""
    replaced_at: tuple[tuple[int, int, int], int] | None = None
    """(session, stream, initial term id) of the log it read before it was replaced, and where we
    stopped in it: a new log of the same stream whose first frame lies past it skipped what was between."""

    def channels_of(self, tag: int) -> tuple[int, ...]:
        """The channels whose rows a message tagged `tag` carries here: its own, and those whose
        rows come under its tag."""
        tagged = self.tagged.get(tag)
        if not tagged:
            return (tag,)
        return ((tag,) if tag in self.users else ()) + tuple(sorted(tagged))


class Inputs:
    """The input logs of one worker, read as one subscription (one image per log)."""

    def __init__(self, site: str, qualified_name: str, counters: CountersFile) -> None:
        self.site = site
        self.qualified_name = qualified_name
        self.counters = counters
        self.found: dict[Path, Input] = {}
        self.subscription = Subscription()
        self._images: dict[int, Input] = {}
        self.next_look_s = 0.0
        """When to look for the logs not found yet (the clock's seconds)."""
        self.note_joins = False
        """Note the last event time of each live input as it is joined (written_before_us): only a
        windowed function asks, and finding it walks two terms of the log."""
        self.resume_live_from_us: int | None = None
        """Set (a windowed worker restarted), a live input is joined where its rows reach this event
        time, when the log still holds them (frame_walk.resume_position), instead of at its tail."""
        self.lost: list[tuple[Path, set[int], str]] = []
        """Logs replaced or ended while replay channels read them, those channels and what happened: the
        worker fails them."""

    def use(self, path: Path, function: Function, user, tag: int | None = None) -> None:
        """`user` reads the log at `path`, which carries `function`'s rows (a replay channel's
        tagged with `tag`, when another channel's tag carries them)."""
        found = self.found.get(path)
        if found is None:
            received = path.parent == paths.received_replayer_logs_dir(self.site)
            found = self.found[path] = Input(path, function.schema, function.event_time, function.qualified_name,
                                             shared=received or path.parent == paths.replayer_logs_dir(self.site),
                                             received=received)
        found.users.add(user)
        if tag is not None and tag != user:
            found.tagged.setdefault(tag, set()).add(user)

    def release(self, path: Path, user) -> None:
        """`user` no longer reads the log; the last one closes it."""
        found = self.found.get(path)
        if found is None:
            return
        found.users.discard(user)
        for tag in [t for t, channels in found.tagged.items() if user in channels]:
            found.tagged[tag].discard(user)
            if not found.tagged[tag]:
                del found.tagged[tag]
        if not found.users:
            del self.found[path]
            if found.image is not None:
                self._close_image(found)

    def _close_image(self, found: Input) -> None:
        self._images.pop(id(found.image), None)
        self.subscription.remove_image(found.image)
        found.log.close()
        found.image = found.log = found.assembler = None

    def look_now(self) -> None:
        """Look for the missing logs in this duty cycle (a replay's, just named)."""
        self.next_look_s = 0.0

    def look(self, now_s: float) -> None:
        """Open the logs that have appeared, when it is time to look (`now_s`: the clock's seconds)."""
        if now_s >= self.next_look_s:
            self.next_look_s = now_s + self.open_waiting(now_s)

    def open_waiting(self, now_s: float | None = None) -> float:
        """Open the input logs that have appeared; returns when to look again (seconds from now):
        soon while a replay waits for one. `now_s`: the clock's seconds, to tell a stalled stream."""
        wait_s = LOG_WAIT_INTERVAL_S
        for found in self.found.values():
            if found.image is not None and found.image.is_closed:
                self._rejoin(found)
            if found.image is not None and _inode(found.path) not in (None, found.log.inode):
                position, tail = found.image.position, found.log.producer_position()
                log.warning("%s: %s was replaced (its writer started anew, or netd rebuilt it): reading the new "
                            "one from its first frame, at position %d of the old one", self.qualified_name,
                            found.path, position)
                had_frames = tail > found.joined_at
                if position < tail and LIVE_CHANNEL in found.users:  # (replays: `lost` below)
                    self._skipped(found, f"positions {position} to {tail} of the replaced log were not read")
                found.replaced_at = ((found.log.session_id, found.log.stream_id, found.log.initial_term_id), position)
                self._close_image(found)
                found.replaced = True
                if (replays := found.users - {LIVE_CHANNEL}) and had_frames:
                    self.lost.append((found.path, replays, "was rebuilt anew (a netd restarted?): what the old one "
                                                           "had not received is lost to the replay"))
            if found.image is not None:
                if found.received and (waiting := found.users - {LIVE_CHANNEL} - found.ended):
                    self._check_received(found, waiting, now_s)
                continue
            try:
                found.log = LogBuffer.open(found.path) if found.path.exists() else None
            except LogBufferError as e:
                log.debug("%s not ready yet: %s", found.path, e)  # being created: look again
            if found.log is None:
                if found.users - {LIVE_CHANNEL}:
                    wait_s = REPLAY_LOG_WAIT_INTERVAL_S
                continue
            at_tail = not (found.replaced or found.received)  # else from its first frame: nothing missed
            join_position = None if at_tail else first_frame_position(found.log)
            assembler = BlockAssembler()
            if found.rejoin_at is not None:  # dropped by its writer: on from where we were
                (join_position, assembler), at_tail = found.rejoin_at, False
            resumed = ""
            if at_tail and LIVE_CHANNEL in found.users and self.resume_live_from_us is not None:
                join_position = resume_position(found.log, self.resume_live_from_us)
                at_tail = join_position is None
                resumed = (f" (resuming: its rows from event time {self.resume_live_from_us} µs on)" if not at_tail else
                           f" (its tail: it no longer holds the rows from event time {self.resume_live_from_us} µs on)")
            try:
                found.image = Image(found.log, self.counters, name=f"{self.qualified_name} <- {found.path.name}",
                                    join_position=join_position)
            except CountersFileError as e:
                self._refused(found, e)
                continue
            found.refused = False
            found.rejoin_at = None
            if found.replaced_at is not None:
                self._check_went_on(found, join_position)
            if self.note_joins and at_tail and LIVE_CHANNEL in found.users:
                # Rows written once the image joined are read: only those before it were missed.
                found.written_before_us = last_event_time_us(found.log, before=found.image.position)
            found.assembler = assembler
            found.joined_at = found.image.position
            self._images[id(found.image)] = found
            self.subscription.add_image(found.image)
            log.info("%s reads %s from position %d%s", self.qualified_name, found.path, found.image.position, resumed)
        return wait_s

    def _rejoin(self, found: Input) -> None:
        """Its image was closed under us: the writer dropped us (the worker stalled past the
        subscriber liveness timeout: a confserver call that blocked through a reconnection). Read
        on from where we were while the log still holds it (the term before the active one is kept
        as written), else from its tail, saying what was lost: it was read by nobody for good."""
        position, assembler = found.image.position, found.assembler
        tail, term_length = found.log.producer_position(), found.log.term_length
        self._close_image(found)
        if position >= tail - term_length:
            found.rejoin_at = (position, assembler)  # the same stream: a message begun goes on
            log.warning("%s: its writer dropped it from %s (it stalled): reading on from position %d",
                        self.qualified_name, found.path, position)
        else:
            what = f"its writer dropped it (it stalled), and the log no longer holds positions {position} to {tail}"
            if replays := found.users - {LIVE_CHANNEL} - found.ended:
                self.lost.append((found.path, replays, f"lost rows: {what}"))
                found.ended |= replays
            if LIVE_CHANNEL in found.users:
                self._skipped(found, what)

    def _check_went_on(self, found: Input, join_position: int | None) -> None:
        """A replaced log read from its first frame: if it is the same stream going on past where we
        were in the old one (netd rebuilt a stream whose sender skipped what its writer overtook while
        nobody received it: a netd away past the writer's tether hold), what lay between is lost."""
        (stream, position), found.replaced_at = found.replaced_at, None
        same = (found.log.session_id, found.log.stream_id, found.log.initial_term_id) == stream
        if same and join_position is not None and join_position > position and LIVE_CHANNEL in found.users:
            self._skipped(found, f"the new log goes on at position {join_position}: positions {position} to "
                                 f"{join_position} never came")

    def _skipped(self, found: Input, what: str) -> None:
        if not found.skipped:
            log.error("%s: rows of %s are lost to it: %s (its output will say which windows may miss "
                      "them)", self.qualified_name, found.path, what)
        found.skipped = True

    def joined_after_us(self) -> int | None:
        """The largest event time the live inputs held before this worker joined them (None: none
        had a row): a window that began after it gets every row; an older one may have missed some."""
        return max((f.written_before_us for f in self.found.values() if f.written_before_us is not None),
                   default=None)

    def _refused(self, found: Input, error: CountersFileError) -> None:
        """No counter for a reader of the log (this process's share, or the site's file, used up):
        the worker goes on with the inputs it reads; a replay waiting on this one fails, naming
        why, and the live stream is tried again at the next look."""
        found.log.close()
        found.log = None
        if replays := found.users - {LIVE_CHANNEL} - found.ended:
            self.lost.append((found.path, replays, f"cannot be read: {error}"))
            found.ended |= replays
        if not found.refused:
            log.warning("%s cannot read %s yet (tried again every %g s): %s", self.qualified_name, found.path,
                        LOG_WAIT_INTERVAL_S, error)
            found.refused = True

    def _check_received(self, found: Input, waiting: set[int], now_s: float | None) -> None:
        """Another site's replayer's log that replay channels still wait on: ended, or stalled?"""
        position = found.image.position
        if found.image.is_end_of_stream:
            problem = "ended before the replay did (another site's netd sending it went away?)"
        elif now_s is None:
            return
        elif position != found.progress[0] or found.log.producer_position() > position:
            found.progress = (position, now_s)  # moving, or holding what we have not read yet
            return
        elif now_s - found.progress[1] > RECEIVED_STALL_S:
            problem = f"brought nothing for {RECEIVED_STALL_S:g} s (its stream stalled between the two sites' netds)"
        else:
            return
        self.lost.append((found.path, waiting, problem))
        found.ended |= waiting

    def poll(self) -> tuple[int, list[tuple[Input, bytes]]]:
        """One block of committed frames from each image: how many images gave one, and their
        whole messages with the input each came from, in image order."""
        read = 0
        inbox: list[tuple[Input, bytes]] = []
        for image in self.subscription.images:
            found = self._images.get(id(image))
            if found is not None and image.block_poll(found.assembler.on_block, POLL_BLOCK_LENGTH):
                read += 1
                inbox += [(found, message) for message in found.assembler.take()]
        return read, inbox

    def keep_alive(self) -> None:
        """Held back by our readers, not dead: the writers must wait, not drop us."""
        self.subscription.keep_alive()

    @property
    def position(self) -> int:
        return sum(image.position for image in self.subscription.images)

    def close(self) -> None:
        self.subscription.close()
        for found in self.found.values():
            if found.log is not None:
                found.log.close()


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def first_frame_position(log_buffer: LogBuffer) -> int:
    """The position of the oldest frame a log holds, in the term before its active one or in the
    active one (not past its tail): where a reader starts on a log that replaced the one it read.
    Before a new stream's first frame the log is zeros (an image joins its stream mid-term), and
    frames are 32-byte aligned, so the first non-zero aligned word is a frame's length."""
    tail = log_buffer.producer_position()
    active = log_buffer.active_term_count
    for count in range(max(0, active - 1), active + 1):
        words = np.frombuffer(log_buffer.terms[index_by_term_count(count)], dtype=np.int32)
        found = np.flatnonzero(words[::FRAME_ALIGNMENT // words.itemsize])
        if found.size:
            return min((count << log_buffer.position_bits_to_shift) + int(found[0]) * FRAME_ALIGNMENT, tail)
    return tail
