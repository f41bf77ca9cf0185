"""Timing and sizing constants of the UDP protocol, with their units, in one place.

Each is Aeron's C media driver default (the macro named beside it), as the captures in
aeron-vectors/udp/ show them (README.txt there: "Timing constants").
"""

RECEIVER_WINDOW_MAX_BYTES = 128 * 1024
"""The receiver's initial window (AERON_RCV_INITIAL_WINDOW_LENGTH_DEFAULT); a receiver's window is
min(this, termLength / 2), so a sender never gets more than half a term ahead of the reader."""

SM_WINDOW_THRESHOLD_DIVISOR = 4
"""An SM is sent as soon as the consumption position moved more than window / 4 past the last SM's."""

SM_TIMEOUT_NS = 200_000_000
"""An SM is sent at least this often, even with no progress (AERON_RCV_STATUS_MESSAGE_TIMEOUT_NS_DEFAULT)."""

SETUP_RETRY_NS = 100_000_000
"""A sender without SMs repeats its SETUP this often (AERON_NETWORK_PUBLICATION_SETUP_TIMEOUT_NS)."""

HEARTBEAT_IDLE_NS = 100_000_000
"""A sender that sent nothing for this long sends a heartbeat (AERON_NETWORK_PUBLICATION_HEARTBEAT_TIMEOUT_NS)."""

NAK_UNICAST_DELAY_NS = 100_000
"""A receiver waits this long after finding a gap before NAKing it (AERON_NAK_UNICAST_DELAY_NS_DEFAULT)."""

NAK_RETRY_NS = 100 * NAK_UNICAST_DELAY_NS
"""A NAK not answered is repeated after this (the unicast delay times Aeron's retry ratio, 100)."""

RETRANSMIT_UNICAST_DELAY_NS = 0
RETRANSMIT_UNICAST_LINGER_NS = 10_000_000
"""A sender retransmits a NAKed range at once, and ignores NAKs of that range for this long after."""

IMAGE_LIVENESS_TIMEOUT_NS = 10_000_000_000
"""An image whose sender went silent this long ends (AERON_IMAGE_LIVENESS_TIMEOUT_NS_DEFAULT)."""

PUBLICATION_LINGER_NS = 5_000_000_000
"""A closed publication keeps sending EOS heartbeats this long, unless an EOS SM ends it early."""

SENDER_MAX_DATAGRAMS_PER_WORK = 16
"""A sender's do_work sends at most this many DATA datagrams, so one duty cycle stays bounded and
control frames (SMs, NAKs) are read between bursts (Aeron's C sender sends 2 per send call)."""

RETRANSMIT_MAX_ACTIVE = 16
"""At most this many NAKed ranges linger at once (AERON_RETRANSMIT_HANDLER_MAX_RETRANSMITS): a NAK
past it is ignored, and the receiver asks again after its retry delay."""

SEND_SETUP_RETRY_NS = 100_000_000
"""A receiver asks an unknown session for a SETUP (an SM with SEND_SETUP) at most this often, so a
flood of DATA from a session it has no image of gives one SM, not one per datagram."""
