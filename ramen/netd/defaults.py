"""netd's constants, with their units, in one place (the protocol's are ramen.transport.udp.defaults)."""

LOG_CHECK_INTERVAL_S = 0.2
"""How often netd looks again for the logs it is to send that do not exist yet, or were replaced."""

DEFAULT_LISTEN = "127.0.0.1:0"
"""netd's receive endpoint: loopback, and a free port (written into sites/<site>/net/endpoint)."""

CONFSERVER_IDENTITY = "supervisor"
"""Who netd is to the confserver: it reads net/ keys and writes its endpoint key."""
