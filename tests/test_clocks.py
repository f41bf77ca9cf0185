import pytest

from ramen.clocks import NANOS_PER_SECOND, SYSTEM_CLOCK, ManualClock


def test_manual_clock_moves_both_readings_together():
    clock = ManualClock(epoch_us=5_000_000, nanos=7 * NANOS_PER_SECOND)
    clock.advance(1.5)
    assert clock.epoch_us() == 6_500_000
    assert clock.nanos() == 8_500_000_000
    assert clock.seconds() == 8.5


def test_manual_clock_refuses_to_go_back():
    with pytest.raises(ValueError, match="does not go back"):
        ManualClock().advance(-1)


def test_system_clock_is_monotonic_and_near_the_wall():
    import time
    first = SYSTEM_CLOCK.nanos()
    assert SYSTEM_CLOCK.nanos() >= first
    assert abs(SYSTEM_CLOCK.epoch_us() - time.time_ns() // 1000) < 60_000_000
