"""The queue a loop waits on with a timeout, in a process that handles signals.

Always `queue.Queue`, never `queue.SimpleQueue`: in CPython 3.11, a signal handled in the main
thread while it waits in `SimpleQueue.get(timeout=…)`, whose handler returns after that timeout,
leaves the get waiting for ever (the C code recomputes a negative timeout, which means "no
timeout"). A supervisor that got its SIGTERM just then never stopped. `Queue.get` (a Condition)
gives up at its deadline."""

import queue


def wait_queue() -> queue.Queue:
    return queue.Queue()
