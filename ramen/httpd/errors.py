"""What a request is answered in one line, and with which HTTP status: the user errors of httpd."""

from __future__ import annotations

from ramen.httpd import tagdb, target
from ramen.httpd.admission import Overloaded
from ramen.httpd.fetch import FetchError, FetchTooBig
from ramen.httpd.names import PathError
from ramen.httpd.regexes import RegexError
from ramen.times import TimeError


class BadRequest(ValueError):
    """A request httpd cannot answer as asked: 400 with this one line."""


USER_ERRORS = (BadRequest, PathError, TimeError, target.TargetError, tagdb.TagRequestError, RegexError, FetchError,
               FetchTooBig, Overloaded)
"""What a request is answered in one line (400, 502 for a failed replay, 503 when overloaded); anything
else is a bug."""


def status_of(error: Exception) -> int:
    """The HTTP status of a user error: a replay that failed is the peer's (502), too many long replays
    ours for a while (503), the rest the request's."""
    if isinstance(error, Overloaded):
        return 503
    return 502 if isinstance(error, FetchError) else 400


def headers_of(error: Exception) -> dict[str, str]:
    return {"Retry-After": str(error.retry_after_s)} if isinstance(error, Overloaded) else {}
