"""`ramen logbuffer inspect` reads log buffers written by real Aeron, message for message."""

import base64
import json
import subprocess
import sys

import pytest

from tests.vectors import LOGBUFFER_LENS, expected_payload, read_logbuffer_manifest

LOGS = {
    "ipc_small.publications.3.logbuffer": "ipc_small.manifest.csv",
    "ipc_excl_wrap.publications.3.logbuffer": "ipc_excl_wrap.manifest.csv",
    "udp_localhost.publications.3.logbuffer": "udp_localhost.manifest.csv",
    "udp_localhost.images.4.logbuffer": "udp_localhost.manifest.csv",
}


def inspect_json(path) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "ramen.cli.main", "logbuffer", "inspect", "--json", str(path)],
                            capture_output=True, text=True, check=True)
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("log_name", sorted(LOGS))
def test_inspect_reproduces_the_messages_of_the_snapshot_window(aeron_vectors, log_name):
    manifest = read_logbuffer_manifest(aeron_vectors / "logbuffers" / LOGS[log_name])
    records = inspect_json(aeron_vectors / "logbuffers" / log_name)
    metadata, messages = records[0], records[1:]

    assert metadata["type"] == "metadata"
    assert metadata["term_length"] == int(manifest.params["term_length"])
    assert metadata["initial_term_id"] == int(manifest.params["initial_term_id"])
    assert metadata["mtu_length"] == 1408
    assert metadata["page_size"] == 4096
    assert metadata["default_frame_header_length"] == 32

    # Every message we report is one Aeron wrote, at its position, with its bytes and frame.
    positions = [m["position"] for m in messages]
    assert positions == sorted(set(positions))
    for m in messages:
        assert m["type"] == "message"
        index, length = manifest.tx[m["position"]]
        rx = manifest.rx[index]
        assert (m["length"], m["term_id"], m["term_offset"]) == (length, rx.term_id, rx.term_offset)
        assert (m["session_id"], m["stream_id"]) == (int(manifest.params["session_id"]), int(manifest.params["stream_id"]))
        assert base64.b64decode(m["payload_b64"]) == expected_payload(index, LOGBUFFER_LENS)

    # And none of the snapshot window is missing: from the subscriber's position to the
    # publication's (an image holds what it had received, so up to its last message).
    window_end = manifest.snapshot["publication_position"]
    if ".images." in log_name:
        window_end = max(positions)
    window = [rx.position for rx in manifest.rx.values()
              if rx.after_snapshot and rx.position <= window_end]
    assert window, "the snapshot window of the manifest is empty"
    assert set(window) <= set(positions)


def test_inspect_decodes_tail_counters_of_a_rotated_log(aeron_vectors):
    metadata = inspect_json(aeron_vectors / "logbuffers" / "ipc_excl_wrap.publications.3.logbuffer")[0]
    tails = metadata["term_tail_counters"]
    assert metadata["active_term_count"] == 3
    # Term 1003 is active in partition 0; the two before it are full: their tails pass the term end.
    assert tails[0]["term_id"] == 1003
    assert [t["term_id"] for t in tails[1:]] == [1001, 1002]
    assert all(t["term_offset"] >= 65536 for t in tails[1:])
    assert metadata["producer_position"] == 217280


def test_image_log_with_zero_tails_is_walked_by_frames(aeron_vectors):
    records = inspect_json(aeron_vectors / "logbuffers" / "udp_localhost.images.4.logbuffer")
    assert all(t["raw"] == 0 for t in records[0]["term_tail_counters"])
    assert len(records) > 1
