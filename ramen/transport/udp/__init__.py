"""Aeron network publications over UDP: the wire protocol (protocol.py), channel strings
(channel.py) and the receiver's image rebuild (rebuild.py). Sockets and agents come next
(docs/network.md)."""
