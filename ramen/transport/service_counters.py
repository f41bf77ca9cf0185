"""A service's counters (the supervisor's restarts, the choreographer's recomputes, the archiver's
bytes recorded) in the counters file, read and written as plain attributes.

They live where `ramen stat` reads every other counter of the site, each of its own type
(SERVICE_COUNTER_TYPE_IDS in counters.py) and labelled `<service> <instance> <name>`. A subclass
names them, with what each counts:

    class SupervisorCounters(ServiceCounters, service="supervisor"):
        restarts = Count("Starts of a worker after it crashed.")

and the service's code counts with `counters.restarts += 1`. Made with `ServiceCounters()` they
live in memory (tests of a service's logic run many services in one process); `allocate()` puts
them in a counters file, `close()` frees them there and keeps their last values here. A run that
died leaves its counters to the next run of the same instance, which frees them as it allocates
its own (CountersFile.free_orphans).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from ramen.transport.counters import (MAX_KEY_LENGTH, SERVICE_COUNTER_TYPE_IDS, Counter, CountersFile,
                                      InMemoryCounter)


class Count:
    """One counter of a ServiceCounters subclass, an int attribute of its instances."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, counters: "ServiceCounters | None", owner: type | None = None):
        return self if counters is None else counters._slots[self.name].get()

    def __set__(self, counters: "ServiceCounters", value: int) -> None:
        counters._slots[self.name].set(value)


class ServiceCounters:
    """The counters of one instance of a service; subclasses name them (Count) and the service."""

    SERVICE: ClassVar[str]
    NAMES: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, *, service: str, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.SERVICE = service
        cls.NAMES = tuple(name for name, value in vars(cls).items() if isinstance(value, Count))
        unknown = sorted(set(cls.NAMES) - set(SERVICE_COUNTER_TYPE_IDS.get(service, ())))
        if unknown:
            raise TypeError(f"{cls.__name__}: no type id for {service} {unknown} in SERVICE_COUNTER_TYPE_IDS")

    def __init__(self) -> None:
        self._slots: dict[str, Counter | InMemoryCounter] = {name: InMemoryCounter() for name in self.NAMES}

    @classmethod
    def allocate(cls, counters: CountersFile, instance: str) -> "ServiceCounters":
        """The counters of one instance of the service (the supervisor of a site, the archiver
        of a directory), allocated in the counters file."""
        allocated = cls()
        try:
            for name in cls.NAMES:
                allocated._slots[name] = allocate_service_counter(counters, cls.SERVICE, name, instance)
        except BaseException:
            allocated.close()
            raise
        return allocated

    @classmethod
    @contextmanager
    def in_file(cls, path: str | os.PathLike, instance: str) -> Iterator["ServiceCounters"]:
        """The instance's counters in the counters file at `path` (created if absent), for the
        life of a service's main; freed at its end."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        counters = CountersFile.open(path)
        try:
            allocated = cls.allocate(counters, instance)
            try:
                yield allocated
            finally:
                allocated.close()
        finally:
            counters.close()

    def to_dict(self) -> dict[str, int]:
        return {name: self._slots[name].get() for name in self.NAMES}

    def close(self) -> None:
        """Free the counters in the file; their last values stay readable here (for the log)."""
        for name, slot in self._slots.items():
            if isinstance(slot, Counter):
                self._slots[name] = InMemoryCounter(slot.get())
                slot.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.to_dict().items())})"


def instance_registration_id(instance: str) -> int:
    """The registration id of an instance's counters: the same for every run of the instance, so
    that a run finds (and frees) what a dead one left."""
    return zlib.crc32(instance.encode())


def allocate_service_counter(counters: CountersFile, service: str, name: str, instance: str) -> Counter:
    """One counter of a service (by its name in SERVICE_COUNTER_TYPE_IDS), first freeing the one a
    dead run of the same instance left. Also for a service that keeps a single counter: the
    replayer's `allocate_service_counter(counters, "replayer", "bytes_read", str(replayer_id))`."""
    type_id = SERVICE_COUNTER_TYPE_IDS[service][name]
    registration_id = instance_registration_id(instance)
    counters.free_orphans(type_id, registration_id)
    return counters.allocate(type_id, f"{service} {instance} {name.replace('_', ' ')}",
                             key=instance.encode()[:MAX_KEY_LENGTH], registration_id=registration_id)
