"""Signed SETUPs (ramen/transport/udp/setup_key.py): the wire form, what verifies, the key file's
checks, and a receiver that takes only signed SETUPs (on a ManualClock, no sockets)."""

from __future__ import annotations

import pytest

from ramen.clocks import ManualClock
from ramen.transport.udp.protocol import SETUP_LENGTH, SETUP_SIGNED_LENGTH, SetupFrame, decode_frame
from ramen.transport.udp.receiver import NetworkReceiver
from ramen.transport.udp.setup_key import MIN_SECRET_BYTES, SetupKey, SetupKeyError

SESSION, STREAM, TERM_LENGTH, MTU = 888, 1005, 65536, 1408
KEY = SetupKey(b"a secret the two sites share")
SETUP = SetupFrame(0, SESSION, STREAM, 0, 0, TERM_LENGTH, MTU)


def test_a_signed_setup_is_56_bytes_that_decode_with_its_tag_and_verify_with_its_key_only():
    signed = KEY.sign(SETUP)
    wire = signed.encode()
    assert len(wire) == SETUP_SIGNED_LENGTH == SETUP_LENGTH + 16
    assert int.from_bytes(wire[:4], "little") == SETUP_SIGNED_LENGTH  # its frameLength says so
    decoded = decode_frame(wire, 0)
    assert decoded == signed and KEY.verifies(decoded)
    assert not SetupKey(b"another secret, as long").verifies(decoded)
    assert not KEY.verifies(SETUP)  # Aeron's 40 bytes: no tag
    assert decode_frame(SETUP.encode(), 0).tag is None
    moved = bytearray(wire)
    moved[8:12] = (4096).to_bytes(4, "little")  # its term offset changed on the way
    assert not KEY.verifies(decode_frame(bytes(moved), 0))


def test_a_key_file_missing_short_or_readable_by_others_is_one_line(tmp_path):
    path = tmp_path / "setup.key"
    with pytest.raises(SetupKeyError, match=r"^setup key .*setup.key: No such file or directory$"):
        SetupKey.load(path)
    path.write_bytes(b"short\n")
    path.chmod(0o600)
    with pytest.raises(SetupKeyError, match=f"a setup key of 5 bytes, fewer than {MIN_SECRET_BYTES}$"):
        SetupKey.load(path)
    path.write_bytes(b"  " + b"k" * 32 + b"\n")
    path.chmod(0o644)
    with pytest.raises(SetupKeyError, match="can be read by others \\(mode 644\\): chmod 600 it$"):
        SetupKey.load(path)
    path.chmod(0o600)
    assert SetupKey.load(path).verifies(SetupKey(b"k" * 32).sign(SETUP))  # whitespace around it ignored


def test_a_receiver_with_a_key_takes_only_setups_signed_with_it_even_for_an_image_it_has(tmp_path):
    receiver = NetworkReceiver(tmp_path, receiver_id=1, clock=ManualClock(), setup_key=KEY)
    receiver.add_subscription(STREAM)
    receiver.on_datagram(SETUP.encode())
    receiver.on_datagram(SetupKey(b"another secret, as long").sign(SETUP).encode())
    assert receiver.images == {} and receiver.setups_refused == 2
    receiver.on_datagram(KEY.sign(SETUP).encode())
    image = receiver.image(SESSION, STREAM)
    assert image is not None
    # Unsigned, a SETUP more than a term past the image would end it (its sender skipped ahead).
    receiver.on_datagram(SetupFrame(0, SESSION, STREAM, 0, 2, TERM_LENGTH, MTU).encode())
    assert receiver.image(SESSION, STREAM) is image and receiver.images_overtaken == 0
    assert receiver.setups_refused == 3
