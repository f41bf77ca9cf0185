"""Telling a Spark that is not there (retry later) from one that is up and failing (report it now),
and noticing a job that stopped moving: the rules, on real sockets and a driven clock."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from ramen.clocks import ManualClock
from ramen.spark.session import is_unavailable, reachable, spark_reason
from ramen.spark.watch import JobWatch


def grpc_error(status: str, details: str) -> SparkConnectGrpcException:
    """What pyspark raises when a call ends with a gRPC status and no Spark error class."""
    return SparkConnectGrpcException(message=f"<_MultiThreadedRendezvous of RPC that terminated with:\n"
                                             f"\tstatus = StatusCode.{status}\n\tdetails = \"{details}\"\n>")


@pytest.fixture
def listening():
    """A Connect endpoint that accepts connections (a server that is up)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"sc://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed():
    """A Connect endpoint nothing listens on (a server that is gone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"sc://127.0.0.1:{port}"


def test_reachable_says_whether_the_server_accepts_connections(listening, closed):
    assert reachable(listening) and not reachable(closed)


def test_a_server_that_is_up_and_answers_unknown_failed_and_is_not_retried(listening, closed):
    """The issue's driver out of heap, and its dead context after: UNKNOWN from a server that
    answers. Retried, every later replay waited out its 300 s timeout."""
    for details in ("Java heap space", "Application error processing RPC"):
        error = grpc_error("UNKNOWN", details)
        assert not is_unavailable(error, listening)
        assert is_unavailable(error, closed)  # a killed server ends calls the same way: retry
        assert is_unavailable(error)  # without an endpoint to ask, as before


def test_a_refused_connection_is_unavailable_even_while_the_port_answers(listening):
    assert is_unavailable(grpc_error("UNAVAILABLE", "failed to connect to all addresses"), listening)


def test_the_reason_names_an_out_of_memory():
    assert spark_reason(grpc_error("UNKNOWN", "Java heap space")).startswith(
        "Spark ran out of memory (Java heap space)")
    assert spark_reason(grpc_error("UNKNOWN", "Application error processing RPC")) == \
        "Application error processing RPC"


def stage(done_tasks: int, bytes_read: int = 0):
    return SimpleNamespace(stage_id=1, num_tasks=10, num_completed_tasks=done_tasks, num_bytes_read=bytes_read,
                           done=False)


def test_a_job_is_stalled_once_its_progress_has_not_moved_for_the_bound():
    clock = ManualClock()
    watch = JobWatch(clock, stall_s=60)
    assert watch.stalled() is None  # no job running
    watch.begin()
    watch([stage(0)], 2, "op", False)
    clock.advance(59)
    watch([stage(0)], 2, "op", False)  # the same progress, reported again: not a move
    assert watch.stalled() is None
    clock.advance(2)
    assert watch.stalled() == pytest.approx(61)
    watch([stage(1)], 2, "op", False)  # a task done: moving again
    assert watch.stalled() is None
    clock.advance(30)
    watch([stage(1, 4096)], 2, "op", False)  # bytes read count as moving
    clock.advance(59)
    assert watch.stalled() is None
    watch.end()
    clock.advance(600)
    assert watch.stalled() is None  # between jobs nothing is stalled


def test_a_job_without_any_progress_report_stalls_from_its_start():
    clock = ManualClock()
    watch = JobWatch(clock, stall_s=10)
    watch.begin()
    clock.advance(11)
    assert watch.stalled() == pytest.approx(11)
    watch.begin()  # the next call starts its own count
    assert watch.stalled() is None


def test_the_bound_is_configurable(monkeypatch):
    monkeypatch.setenv("RAMEN_SPARK_STALL_S", "7.5")
    assert JobWatch(ManualClock()).stall_s == 7.5
