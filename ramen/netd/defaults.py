"""netd's constants, with their units, in one place (the protocol's are ramen.transport.udp.defaults)."""

LOG_CHECK_INTERVAL_S = 0.2
"""How often netd looks again for the logs it is to send that do not exist yet, or were replaced."""
NEW_LOG_CHECK_INTERVAL_S = 0.002
"""How often, in the NEW_LOG_WAIT_S after its key came, netd looks again for a log that is not there,
or not a whole log buffer yet: a replayer lent to another site creates its log only once its key
told it to, and that site's replay waits for the log's first frame."""
NEW_LOG_WAIT_S = 1.0
"""How long a new send's log is looked for every NEW_LOG_CHECK_INTERVAL_S; a log still missing or
unreadable after that is named in a warning."""

DEFAULT_LISTEN = "127.0.0.1:0"
"""netd's receive endpoint: loopback, and a free port (written into sites/<site>/net/endpoint): the
previous netd's of this site where it is still free."""
LAST_ENDPOINT_FILE = "last-port"
"""In the site's net directory: the port netd last bound, for the next one to bind again."""

CONFSERVER_IDENTITY = "supervisor"
"""Who netd is to the confserver: it reads net/ keys and writes its endpoint key."""
