"""A worker's stats: every count it keeps per channel lands in the channel's record."""

from workers.stats import COUNTER_NAMES, WorkerStats

PER_CHANNEL = ("tuples in", "tuples out", "late", "dropped")


def test_every_per_channel_count_is_kept_per_channel_and_in_total():
    stats = WorkerStats("p/f")
    for i, name in enumerate(PER_CHANNEL, start=1):
        stats.add(name, i, channel=0)
        stats.add(name, 10 * i, channel=3)
    record = stats.record(0, 0)
    for i, name in enumerate(PER_CHANNEL, start=1):
        key = name.replace(" ", "_")
        assert record[key] == 11 * i
        assert record["channels"]["0"][key] == i and record["channels"]["3"][key] == 10 * i
    assert set(PER_CHANNEL) <= set(COUNTER_NAMES)
