"""The light function's calls, run in a thread of their own, in the order they were made.

A windowed python function is called once per committed window, and the call takes milliseconds
(pyarrow's group-bys and sorts, which release the GIL). Made from the duty cycle, each call stopped
the reading: a replay's writer filled the log and waited, then the worker read and the pool sat
idle, one after the other. Here the duty cycle submits the call and reads on; results come back in
submission order (`completed`), so a channel's output keeps its order, and at most `max_in_flight`
calls wait, so a slow function holds its inputs back (`full`) rather than piling up windows.

One thread, not a pool: the calls of one channel must run in order, and pyarrow parallelises each
call on its own pool.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Generic, TypeVar

from workers.defaults import MAX_CALLS_IN_FLIGHT

Tag = TypeVar("Tag")


class ComputeThread(Generic[Tag]):
    """Calls in flight, each with a tag (its channel's state) that comes back with its result."""

    def __init__(self, name: str, max_in_flight: int = MAX_CALLS_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._calls: deque[tuple[Tag, Future]] = deque()

    def __len__(self) -> int:
        return len(self._calls)

    @property
    def full(self) -> bool:
        """As many calls wait as may: the caller should not read more input until one returns."""
        return len(self._calls) >= self.max_in_flight

    def submit(self, tag: Tag, call: Callable[..., Any], *args) -> None:
        self._calls.append((tag, self._executor.submit(call, *args)))

    def completed(self) -> list[tuple[Tag, Any]]:
        """The results of the calls that have returned, oldest first, up to the first still
        running (later ones wait for it: order is kept). A call's exception is raised here, in
        the caller's thread."""
        results = []
        while self._calls and self._calls[0][1].done():
            tag, future = self._calls.popleft()
            results.append((tag, future.result()))
        return results

    def wait(self, timeout_s: float) -> None:
        """Until the oldest call returns, or `timeout_s`: an idle duty cycle wakes when there is a
        result to write, not a park later."""
        if self._calls:
            wait([self._calls[0][1]], timeout=timeout_s, return_when=FIRST_COMPLETED)

    def drain(self) -> list[tuple[Tag, Any]]:
        """Every call's result, oldest first, waiting for those still running."""
        wait([future for _, future in self._calls])
        return self.completed()

    def close(self) -> None:
        """Drop the calls not started; wait for the running one (a thread cannot be stopped)."""
        self._calls.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)
