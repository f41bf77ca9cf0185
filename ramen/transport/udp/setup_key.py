"""The setup key: a secret the sites that send to each other share, so that only they can open
streams at each other's netd.

Beyond Aeron, which authenticates nothing: anyone who reaches a receiver's port can make it
allocate an image (a log and counters) with a 40-byte SETUP. The receiver bounds images per stream
and per source, and netd takes an allow-list of networks (receiver_agent.py); where addresses are
not enough (a shared network, spoofable sources), a site asks for signed SETUPs: each SETUP its
sender sends carries an HMAC-SHA-256 of its 40 bytes (protocol.SETUP_SIGNED_LENGTH), and its
receiver takes no SETUP without a tag the key makes, for a new image or an existing one (an
unsigned SETUP past an image's position would end it). It authenticates who may open a stream,
not each DATA frame, and hides nothing: across untrusted networks, a VPN or IPsec does that.

The key file holds the secret as its bytes (at least MIN_SECRET_BYTES, whitespace around them
ignored): `head -c 32 /dev/urandom | base64 > setup.key`, copied to every site, readable by the
user netd runs as only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import stat
from pathlib import Path

from ramen.transport.errors import TransportError
from ramen.transport.udp.protocol import SETUP_TAG_LENGTH, SetupFrame

MIN_SECRET_BYTES = 16


class SetupKeyError(TransportError):
    """A setup key file that cannot be used (missing, too short, readable by others)."""


class SetupKey:
    """Signs the SETUPs a sender sends; tells whether a SETUP received was signed with it."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise SetupKeyError(f"a setup key of {len(secret)} bytes, fewer than {MIN_SECRET_BYTES}")
        self._secret = secret

    @classmethod
    def load(cls, path: str | os.PathLike) -> SetupKey:
        path = Path(path)
        try:
            mode = path.stat().st_mode
            secret = path.read_bytes().strip()
        except OSError as e:
            raise SetupKeyError(f"setup key {path}: {e.strerror or e}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SetupKeyError(f"setup key {path} can be read by others (mode {stat.S_IMODE(mode):o}): "
                                f"chmod 600 it")
        try:
            return cls(secret)
        except SetupKeyError as e:
            raise SetupKeyError(f"setup key {path}: {e}") from None

    def sign(self, setup: SetupFrame) -> SetupFrame:
        signed = dataclasses.replace(setup, tag=bytes(SETUP_TAG_LENGTH))  # its frameLength says signed
        return dataclasses.replace(signed, tag=self._tag(signed))

    def verifies(self, setup: SetupFrame) -> bool:
        return setup.tag is not None and hmac.compare_digest(setup.tag, self._tag(setup))

    def _tag(self, setup: SetupFrame) -> bytes:
        return hmac.new(self._secret, setup.fields(), hashlib.sha256).digest()[:SETUP_TAG_LENGTH]
