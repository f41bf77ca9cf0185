"""The agents over real sockets through the lossy proxy: every message arrives exactly once and in
order at 0%, 5% and 20% loss (both directions lossy, duplicates, reordering), and the stream ends
with the publication's close: EOS, the linger ended by the receiver's EOS SM, counters freed."""

from __future__ import annotations

import pytest

from tests.transport.udp.agent_rig import Faults, Rig, is_data

MESSAGES = 400
"""545216 bytes of frames: over eight 64 KiB terms, with PADs."""


@pytest.mark.parametrize("loss,seed", [(0.0, 1), (0.05, 2), (0.20, 3)])
def test_every_message_arrives_exactly_once_and_in_order_through_a_lossy_proxy(tmp_path, loss, seed):
    rig = Rig(tmp_path, seed=seed, count=MESSAGES,
              forward=Faults(loss=loss, duplicate=0.05, max_delay_cycles=3, drop_if=is_data),
              backward=Faults(loss=loss / 2, duplicate=0.05, max_delay_cycles=3))
    try:
        rig.run_until(lambda: rig.readers and len(rig.reader.got) == MESSAGES, 400_000)
        assert len(rig.readers) == 1
        assert rig.reader.got == rig.expected
        image = f"{888} {1003}"
        if loss:
            assert rig.proxy.forward.dropped > 0
            assert rig.counter("naks-sent", image) > 0 and rig.counter("loss-gaps", image) > 0
            assert rig.counter("retransmits", image) > 0
        else:
            assert rig.proxy.forward.dropped == 0
        assert rig.counter("rcv-pos", image) == rig.publication.position
        assert rig.counter("snd-pos", image) == rig.publication.position
        # The end: the publication closes, its EOS reaches the reader, whose drained image makes the
        # receiver's SMs carry EOS, which ends the sender's linger at once: its counters go.
        rig.publication.close()
        rig.run_until(lambda: rig.reader.image.is_end_of_stream and not rig.sender.publications, 200_000)
        assert not rig.has_counter("snd-pos") and not rig.has_counter("sub-pos", "->")
    finally:
        rig.close()
