"""A worker's stats: every count it keeps per channel lands in the channel's record."""

from workers.stats import COUNTER_NAMES, WorkerCounters

PER_CHANNEL = ("tuples in", "tuples out", "late", "dropped")


def test_every_per_channel_count_is_kept_per_channel_and_in_total():
    stats = WorkerCounters("p/f")
    for i, name in enumerate(PER_CHANNEL, start=1):
        stats.add(name, i, channel=0)
        stats.add(name, 10 * i, channel=3)
    record = stats.record(0, 0)
    for i, name in enumerate(PER_CHANNEL, start=1):
        key = name.replace(" ", "_")
        assert getattr(record, key) == 11 * i
        assert getattr(record.channels[0], key) == i and getattr(record.channels[3], key) == 10 * i
    assert set(PER_CHANNEL) <= set(COUNTER_NAMES)


def test_each_total_has_a_counter_of_its_own_type_labelled_by_worker(tmp_path):
    """`ramen stat` tells a worker's counters by type, as the services' (not Aeron's system type 0)."""
    from ramen.transport import counters as ctr
    from ramen.transport.counters import CountersFile
    counters = CountersFile.open(tmp_path / "counters.dat")
    stats = WorkerCounters("p/f", counters)
    stats.add("tuples out", 7)
    found = {c.label: c for c in counters.counters()}
    for name in COUNTER_NAMES:
        counter = found[f"worker p/f {name}"]
        assert counter.type_id == ctr.SERVICE_COUNTER_TYPE_IDS["worker"][name.replace(" ", "_")]
        assert ctr.TYPE_NAMES[counter.type_id] == f"worker-{name.replace(' ', '-')}"
    assert found["worker p/f tuples out"].value == 7
