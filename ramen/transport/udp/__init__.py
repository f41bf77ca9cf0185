"""Aeron network publications over UDP: the wire protocol (protocol.py), channel strings
(channel.py), the pure cores of the sender (sender.py) and the receiver (receiver.py, rebuild.py),
and the agents that run them behind real sockets (sender_agent.py, receiver_agent.py, sockets.py;
docs/network.md)."""
