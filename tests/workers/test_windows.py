"""Tumbling event-time windows: commit on the watermark, late rows counted and dropped, flush."""

import pyarrow as pa

from workers.windows import WindowState

MINUTE_US = 60_000_000
SECOND_US = 1_000_000


def rows(*seconds: float, value: int = 1) -> pa.RecordBatch:
    times = [int(s * SECOND_US) for s in seconds]
    return pa.RecordBatch.from_pydict({"ts": pa.array(times, pa.timestamp("us")), "v": [value] * len(times)})


def test_a_window_commits_when_the_watermark_passes_its_end():
    windows = WindowState(MINUTE_US, 10 * SECOND_US)
    assert windows.add(rows(1, 30, 59), "ts") == []
    assert windows.add(rows(65), "ts") == []  # watermark 55 s: minute 0 still open
    closed = windows.add(rows(70), "ts")  # watermark 60 s: minute 0 ends
    assert [(c.start_us, c.end_us, c.table.num_rows) for c in closed] == [(0, MINUTE_US, 3)]
    assert list(windows.open) == [1]


def test_windows_are_aligned_to_the_epoch_and_a_batch_spanning_several_is_split():
    windows = WindowState(MINUTE_US)
    closed = windows.add(rows(179, 5, 61, 62, 0, 185), "ts")
    assert [(c.start_us // MINUTE_US, c.table.column("ts").cast(pa.int64()).to_pylist()) for c in closed] == [
        (0, [5 * SECOND_US, 0]), (1, [61 * SECOND_US, 62 * SECOND_US]), (2, [179 * SECOND_US])]
    assert list(windows.open) == [3]


def test_late_rows_are_counted_and_never_mixed_into_a_later_window():
    windows = WindowState(MINUTE_US, 0)
    windows.add(rows(10, 20), "ts")
    closed = windows.add(rows(61), "ts")
    assert [c.table.num_rows for c in closed] == [2]
    assert windows.add(rows(30, 40, 62, value=7), "ts") == []
    assert windows.late == 2
    flushed = windows.flush()
    assert [c.table.column("v").to_pylist() for c in flushed] == [[1, 7]]


def test_rows_without_event_time_count_as_late():
    windows = WindowState(MINUTE_US)
    batch = pa.RecordBatch.from_pydict({"ts": pa.array([None, SECOND_US], pa.timestamp("us")), "v": [1, 2]})
    windows.add(batch, "ts")
    assert windows.late == 1 and windows.open_rows == 1


def test_flush_commits_every_open_window_in_order_and_later_rows_for_them_are_late():
    windows = WindowState(MINUTE_US, 30 * MINUTE_US)
    windows.add(rows(200, 10, 130), "ts")
    assert [c.start_us // MINUTE_US for c in windows.flush()] == [0, 2, 3]
    assert windows.open == {}
    windows.add(rows(190), "ts")
    assert windows.late == 1


def committed(windows: WindowState, *adds) -> list[tuple[int, list[int], list[int]]]:
    out = []
    for batch in adds:
        out += windows.add(batch, "ts", part="p")
    out += windows.flush()
    return [(c.start_us // MINUTE_US, c.table.column("ts").cast(pa.int64()).to_pylist(), c.table.column("v").to_pylist())
            for c in out]


def test_a_table_of_many_messages_gives_the_windows_its_batches_give_one_by_one():
    batches = [rows(1, 30, value=1), rows(59, 61, value=2), rows(62, value=3), rows(125, 170, 185, value=4),
               rows(186, value=5)]
    expected = committed(WindowState(MINUTE_US, 10 * SECOND_US), *batches)
    assert committed(WindowState(MINUTE_US, 10 * SECOND_US), pa.Table.from_batches(batches)) == expected
    assert [w for w, _, _ in expected] == [0, 1, 2, 3]
    # out of order within the table: still every row in its window, in arrival order
    shuffled = [rows(125, value=1), rows(5, 61, value=2), rows(2, value=3)]
    assert committed(WindowState(MINUTE_US), pa.Table.from_batches(shuffled)) == [
        (0, [5 * SECOND_US, 2 * SECOND_US], [2, 3]), (1, [61 * SECOND_US], [2]), (2, [125 * SECOND_US], [1])]


def test_a_window_of_a_table_keeps_the_batches_it_was_cut_from_not_a_copy():
    table = pa.Table.from_batches([rows(1, 2), rows(3, 61)])
    windows = WindowState(MINUTE_US, 10 * MINUTE_US)  # nothing commits yet
    windows.add(table, "ts", part="p")
    assert [(part, b.num_rows) for part, b in windows.open[0]] == [("p", 2), ("p", 1)]
    assert [(part, b.num_rows) for part, b in windows.open[1]] == [("p", 1)]


def header_bounds(batch: pa.RecordBatch) -> tuple[int, int] | None:
    """The bounds a message header carries for this batch (as its producer computes them)."""
    from ramen.message import event_time_bounds
    from ramen.tuples import encode_tuples
    return event_time_bounds(encode_tuples(batch, "ts"))


def window_rows(closed) -> list[tuple[int, list[int], list[int]]]:
    return [(c.start_us, c.table.column("ts").cast(pa.int64()).to_pylist(), c.table.column("v").to_pylist())
            for c in closed]


def test_header_bounds_place_a_batch_whole_and_change_nothing_in_what_is_committed(monkeypatch):
    """Messages inside one window go there on their header's bounds, without the pass over their
    rows; in order, out of order, late, with nulls or straddling a boundary, the windows committed
    and the late count are those of the pass over the rows."""
    import random
    rng = random.Random(7)
    batches = []
    for i in range(300):
        base = i * 2.5 + rng.choice([0, 0, 0, -40, -90])  # mostly in order, some late or reordered
        seconds = sorted(base + rng.random() * 3 for _ in range(rng.randint(1, 6)))
        batch = rows(*seconds, value=i)
        if i % 37 == 0:  # a row without an event time
            batch = pa.RecordBatch.from_pydict({"ts": pa.array([None, *batch.column(0).to_pylist()], pa.timestamp("us")),
                                                "v": [i] * (batch.num_rows + 1)})
        batches.append(batch)
    passes = []
    original_place = WindowState._place
    monkeypatch.setattr(WindowState, "_place", lambda self, *a: passes.append(1) or original_place(self, *a))
    results = {}
    for use_bounds in (False, True):
        passes.clear()
        windows = WindowState(MINUTE_US, 10 * SECOND_US)
        closed = []
        for batch in batches:
            closed += windows.add(batch, "ts", bounds=header_bounds(batch) if use_bounds else None)
        closed += windows.flush()
        results[use_bounds] = (window_rows(closed), windows.late, len(passes))
    (plain, plain_late, plain_passes), (fast, fast_late, fast_passes) = results[False], results[True]
    assert fast == plain and fast_late == plain_late > 0
    assert plain_passes > len(batches) / 2 and fast_passes < plain_passes / 5  # most went whole


def test_a_poll_of_many_messages_goes_to_the_windows_a_window_at_a_time(monkeypatch):
    """A worker catching up takes hundreds of messages a poll (workers.dispatch.by_input): those
    inside one window go there together and whole; only those across an edge get the pass over
    their rows; and what is committed is what the messages one by one commit."""
    from ramen.tuples import encode_tuples
    from workers.dispatch import by_input

    class Found:
        event_time = "ts"
    found = Found()
    batches = [rows(*(i * 25 + k * 5 for k in range(4)), value=i) for i in range(60)]  # 25 s a message, 15 s long
    messages = [(found, encode_tuples(batch, "ts")) for batch in batches]
    runs = by_input([(found, b) for b in batches], messages, MINUTE_US)
    straddling = [b for b in batches if b.column("ts")[0].value // MINUTE_US != b.column("ts")[-1].value // MINUTE_US]
    inside = [(bounds[0] // MINUTE_US, bounds[1] // MINUTE_US) for _, _, bounds in runs
              if bounds[0] // MINUTE_US == bounds[1] // MINUTE_US]
    assert straddling and len(runs) < len(batches)
    assert len({w for w, _ in inside}) == len(inside)  # one run per window
    assert sum(t.num_rows for _, t, _ in runs) == sum(b.num_rows for b in batches)

    looked_at = []  # rows of each pass over rows
    original_place = WindowState._place
    monkeypatch.setattr(WindowState, "_place",
                        lambda self, batch, *a: looked_at.append(batch.num_rows) or original_place(self, batch, *a))
    together, alone = WindowState(MINUTE_US, 10 * SECOND_US), WindowState(MINUTE_US, 10 * SECOND_US)
    closed_together = [c for _, table, bounds in runs for c in together.add(table, "ts", bounds=bounds)]
    closed_together += together.flush()
    assert 0 < sum(looked_at) <= sum(b.num_rows for b in straddling)  # the rows of the rest were never looked at
    closed_alone = [c for b in batches for c in alone.add(b, "ts")] + alone.flush()
    assert window_rows(closed_together) == window_rows(closed_alone) and len(closed_alone) == 25


def test_resumed_windows_drop_the_rows_of_windows_written_before_without_counting_them_late():
    windows = WindowState(MINUTE_US, 10 * SECOND_US)
    windows.resume(2)  # a previous run wrote minutes 0 and 1
    assert windows.add(rows(110, 115, 121, 130), "ts") == []  # read again from where minute 2's rows begin
    assert windows.late == 0 and list(windows.open) == [2]
    closed = windows.add(rows(190), "ts")  # watermark 180 s: minute 2 ends
    assert [(c.start_us // MINUTE_US, c.table.num_rows) for c in closed] == [(2, 2)]
    windows.add(rows(100), "ts")  # minute 1 and 2 are done: a row for them now is late
    assert windows.late == 0  # minute 1's rows never count: the previous run had them
    windows.add(rows(150), "ts")
    assert windows.late == 1
