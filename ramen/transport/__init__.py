"""Aeron log buffers shared between processes: frames, publications, images, subscriptions, counters."""

from ramen.transport.assembler import BlockAssembler, FragmentAssembler, MessageHeader
from ramen.transport.counters import CountersFile, CountersFileError
from ramen.transport.errors import TransportError
from ramen.transport.frame import Header
from ramen.transport.idle import BackoffIdleStrategy
from ramen.transport.image import Image
from ramen.transport.logbuffer import LogBuffer, LogBufferError, LogBufferParams
from ramen.transport.publication import ExclusivePublication
from ramen.transport.replay_publication import ReplayPublication
from ramen.transport.term_appender import BufferClaim
from ramen.transport.status import (ABORT, ADMIN_ACTION, BACK_PRESSURED, BREAK, CLOSED, COMMIT, CONTINUE,
                                    MAX_POSITION_EXCEEDED, NOT_CONNECTED)
from ramen.transport.subscription import Subscription

__all__ = [
    "ABORT", "ADMIN_ACTION", "BACK_PRESSURED", "BREAK", "CLOSED", "COMMIT", "CONTINUE", "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED", "BackoffIdleStrategy", "BlockAssembler", "BufferClaim", "CountersFile", "ExclusivePublication",
    "CountersFileError", "FragmentAssembler", "Header", "Image", "LogBuffer", "LogBufferError", "LogBufferParams",
    "MessageHeader", "ReplayPublication", "Subscription", "TransportError",
]
