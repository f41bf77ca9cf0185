"""The value of a `tails/<id>` key (ephemeral: it goes with the `ramen tail -f` that wrote it): the
function whose live output the tail follows, on which site. That site's choreographer runs the
function and its ancestors while the key is there, even lazy ones; other sites leave it alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ramen import keyspace
from ramen.key_value import KeyValue

__all__ = ["TailRequest"]


@dataclass(frozen=True)
class TailRequest(KeyValue):
    KEY: ClassVar[str] = "tails/<id>"
    target: str
    site: str = keyspace.DEFAULT_SITE
