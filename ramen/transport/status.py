"""Outcomes that hot paths return instead of raising: Aeron's publication results and poll actions."""

NOT_CONNECTED = -1
"""No subscriber is reading this publication: nothing was written."""
BACK_PRESSURED = -2
"""The slowest subscriber is a term window behind: nothing was written, try again later."""
ADMIN_ACTION = -3
"""The term rotated during the offer: nothing was written, try again now."""
CLOSED = -4
"""The publication is closed."""
MAX_POSITION_EXCEEDED = -5
"""The stream reached its largest position; it must be recreated."""

STATUS_NAMES = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}

# Controlled poll actions, returned by a controlled fragment handler (Aeron's ControlledFragmentHandler.Action).
ABORT = 1
"""Do not consume this fragment; stop polling. It is delivered again next time."""
BREAK = 2
"""Consume this fragment and stop polling."""
COMMIT = 3
"""Consume this fragment and publish the position now; continue."""
CONTINUE = 4
"""Consume this fragment and continue."""
