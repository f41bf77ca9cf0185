"""The UDP agents' counters in the counters file: a named group per publication, image or socket.

A group's counters share a label suffix saying what they count for (`snd-pos: 7 1001 pub.logbuffer
-> 127.0.0.1:40123`) and, for a stream, the stream key and the log's correlation id as registration
id, as a publication's own counters have (publication.py), so `ramen stat` and tests find them by
type, label or log. Without a counters file the group keeps its values in memory, so an agent
works, and its tests read the same names, either way; so does a group whose counters the file
refuses (this process holds its share, or the file is full): an agent flooded by strangers goes on
with what it counts in memory, and says so once per group, rather than die.
"""

from __future__ import annotations

import logging

from ramen.transport import counters as ctr
from ramen.transport.counters import Counter, CountersFile, CountersFileError, InMemoryCounter

log = logging.getLogger(__name__)

TYPE_IDS: dict[str, int] = {
    "snd-pos": ctr.SENDER_POSITION_TYPE_ID, "snd-lmt": ctr.SENDER_LIMIT_TYPE_ID, "snd-bpe": ctr.SENDER_BPE_TYPE_ID,
    "rcv-pos": ctr.RECEIVER_POSITION_TYPE_ID, "rcv-hwm": ctr.RECEIVER_HWM_TYPE_ID,
    **ctr.NETWORK_COUNTER_TYPE_IDS,
}
"""Every name a group may have, with its type id."""


class CounterGroup:
    """Counters named from TYPE_IDS (`group["snd-pos"].set(...)`), labelled `<name>: <suffix>`;
    a name given as `garbage short` is counted under `garbage`'s type id, its kind in the label."""

    def __init__(self, counters: CountersFile | None, names, suffix: str, *, key: bytes = b"",
                 registration_id: int = 0) -> None:
        self.file = counters
        self.suffix = suffix
        self._key = key
        self._registration_id = registration_id
        self._refused = False
        """The file refused a counter: the group's next ones are in memory too."""
        self._slots: dict[str, Counter | InMemoryCounter] = {}
        try:
            for name in names:
                self.add_counter(name)
        except BaseException:
            self.close()
            raise

    def add_counter(self, name: str) -> Counter | InMemoryCounter:
        """The counter `name`, allocated now if the group does not have it yet."""
        slot = self._slots.get(name)
        if slot is None:
            type_id = TYPE_IDS[name.split(" ", 1)[0]]
            slot = InMemoryCounter()
            if self.file is not None and not self._refused:
                try:
                    slot = self.file.allocate(type_id, f"{name}: {self.suffix}", key=self._key,
                                              registration_id=self._registration_id)
                except CountersFileError as e:
                    self._refused = True
                    log.warning("counters of '%s' kept in memory from '%s' on: %s", self.suffix, name, e)
            self._slots[name] = slot
        return slot

    def __getitem__(self, name: str) -> Counter | InMemoryCounter:
        return self._slots[name]

    def get(self, name: str) -> int:
        return self._slots[name].get()

    def to_dict(self) -> dict[str, int]:
        return {name: slot.get() for name, slot in self._slots.items()}

    def close(self) -> None:
        """Free the counters in the file; their last values stay readable here."""
        for name, slot in self._slots.items():
            if isinstance(slot, Counter):
                self._slots[name] = InMemoryCounter(slot.get())
                slot.close()


def stream_key(correlation_id: int, session_id: int, stream_id: int) -> bytes:
    """The key a stream's counters have (a publication's and its subscribers' too)."""
    return ctr.STREAM_KEY.pack(correlation_id, session_id, stream_id, 0)


__all__ = ["CounterGroup", "TYPE_IDS", "stream_key"]
