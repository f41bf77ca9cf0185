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

MAX_IMAGES_PER_STREAM = 8
"""Images of one subscribed stream at once (its sender's session, and those of senders restarted
within the liveness timeout): a SETUP past it takes the place of the oldest image that never carried
data, or is refused. Not Aeron's, whose driver makes an image of every SETUP: here each image is a
log file and counters, and anyone who can reach the port can send SETUPs (140 of 40 bytes took all
of a site's counters)."""

MAX_IMAGES_PER_SOURCE = 64
"""Images of one source address (its IP, whatever its ports) at once, over all streams: a SETUP
past it is refused."""

SETUP_REFUSED_LOG_INTERVAL_NS = 10_000_000_000
"""A refused SETUP is logged at most this often (with the count since), so a flood is one line."""

# -- the agents and their sockets (sender_agent.py, receiver_agent.py, sockets.py) ----------------

SOCKET_RCVBUF_BYTES = 2 * 1024 * 1024
"""SO_RCVBUF of every agent socket. Aeron's default is 128 KiB; a Python duty cycle is slower than
the C one, so the kernel holds more of a burst while the agent is busy (Linux caps it at
net.core.rmem_max, 4 MiB here; the kernel doubles what is asked for its bookkeeping)."""

SOCKET_SNDBUF_BYTES = 2 * 1024 * 1024
"""SO_SNDBUF of every agent socket (Aeron leaves the OS default, 208 KiB here): room for a duty
cycle's bursts of every publication of a socket before sendto says EAGAIN."""

PUBLICATION_CONNECTION_TIMEOUT_NS = 5_000_000_000
"""A connected sender with no SM for this long is not connected any more (Aeron's
publication connection timeout): its flow-control position is withdrawn, so the publication sees
NOT_CONNECTED instead of being held back for ever by a receiver that went away."""

RECEIVER_MAX_DATAGRAMS_PER_WORK = 64
"""A receiver's do_work takes at most this many datagrams per socket, so one duty cycle stays
bounded and SMs and NAKs go out between batches (64 is ~90 KB at MTU 1408, well under
SOCKET_RCVBUF_BYTES, so what a batch leaves waits in the kernel, not dropped)."""

SENDER_MAX_CONTROL_DATAGRAMS_PER_WORK = 64
"""A sender's do_work reads at most this many control datagrams (SMs, NAKs) per socket."""

IMAGE_READER_GRACE_NS = 10_000_000_000
"""An ended image's log is closed and removed once no live reader is left on it, or this long after
it ended at the latest (Aeron's image liveness timeout; a reader that stopped polling is dropped by
then anyway, its heartbeat older than the subscriber liveness timeout, 5 s)."""

IMAGE_READER_SCAN_NS = 10_000_000
"""How often a receiver looks in the counters file for new readers of its images."""

UNREAD_IMAGE_HOLD_NS = 5_000_000_000
"""An image with no live reader holds its sender this long (a reader starting up has that long to
join and read from the image's start), then its consumption follows what is rebuilt: nobody reads,
so nothing holds the sender, whose own writer then drops rather than waits (the subscriber
liveness timeout, SUBSCRIBER_LIVENESS_TIMEOUT_S)."""

NAK_MAX_GAPS = RETRANSMIT_MAX_ACTIVE
"""A receiver NAKs this many gaps at once, each on its own timers (Aeron's LossDetector NAKs the
first gap only: at 5% loss a window holds several gaps, and repairing them one NAK after another
cost goodput, bench/network.py lossy); as many as a sender lingers on at once."""

AGENT_NAK_RETRY_NS = 1_000_000
AGENT_RETRANSMIT_LINGER_NS = AGENT_NAK_RETRY_NS
AGENT_STALLED_SM_NS = 1_000_000
"""ramen's agents (netd) repair faster than Aeron's defaults above: a NAK not answered is repeated
after 1 ms, not 10, and a sender lingers on a range it sent again as long; an image that read all
it got and heard nothing for 1 ms since its last SM sends one more (a sender held at its limit by a
lost SM waited the 200 ms SM timeout). At 5% loss on loopback the goodput went from a quarter of
the lossless one to more than half (bench/network.py lossy). Real Aeron peers work with either:
a NAK repeated within Aeron's linger is ignored, an extra SM only moves the limit sooner."""
