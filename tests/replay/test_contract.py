"""The replay's key values: each reads back what it writes, and a value with a missing, unknown or
wrongly typed field is refused in one line naming the key and the field."""

from __future__ import annotations

import pytest

from ramen.replay.contract import (ChannelRange, ContractError, ReplayerAssignment, ReplayerStats, ReplayRequest,
                                   Rider, Summary, WorkerReplay, error_of, with_error)
from ramen.replay.plan import ReplayPlan

PLAN = ReplayPlan("p/t", 0, 100, ("p/src",), (("p/src", "p/t"),), ("p/src", "p/t"))
REQUEST = ReplayRequest("p/t", 0, 100, PLAN, "/ramen/replays/7.logbuffer", created_us=1_700_000_000_000_000,
                        timeout_s=60.0, no_merge=False, pid=4242, summary=Summary(60, ("host",), ("bytes",)))
WORKER = WorkerReplay(7, 0, 100, ("/a.logbuffer", "/b.logbuffer"), expect_eor=2, parents=("p/a", "p/b"),
                      recipient="/ramen/replays/7.logbuffer", also=(Rider(9, "/ramen/replays/9.logbuffer"),))
ASSIGNMENT = ReplayerAssignment(3, "p/src", "/r/3.logbuffer", "/archive",
                                (ChannelRange(7, 0, 100), ChannelRange(8, 50, 150)), readers=2, pid=99,
                                started_us=5)
STATS = ReplayerStats(4096, 10, 1000, {7: 600, 8: 400}, done=True)
VALUES = [REQUEST, WORKER, ASSIGNMENT, STATS]
KEYS = {ReplayRequest: "replays/7", WorkerReplay: "sites/s/workers/p/t/replays/7",
        ReplayerAssignment: "sites/s/replayers/3", ReplayerStats: "sites/s/replayers/3/stats"}
REQUIRED = {ReplayRequest: "plan", WorkerReplay: "inputs", ReplayerAssignment: "channels", ReplayerStats: "done"}


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_value_reads_back_as_written(value):
    assert type(value).from_value(value.to_value()) == value


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_missing_field_is_named_with_the_key(value):
    kind = type(value)
    written = value.to_value()
    del written[REQUIRED[kind]]
    with pytest.raises(ContractError) as caught:
        kind.from_value(written, KEYS[kind])
    assert str(caught.value) == f"{KEYS[kind]}: missing field {REQUIRED[kind]!r}"


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_an_unknown_field_is_named_with_the_key(value):
    kind = type(value)
    with pytest.raises(ContractError) as caught:
        kind.from_value(dict(value.to_value(), renamed_field=1), KEYS[kind])
    assert str(caught.value) == f"{KEYS[kind]}: unknown field 'renamed_field'"


@pytest.mark.parametrize("value, field, wrong, expected", [
    (REQUEST, "since_us", "0", "replays/7: field 'since_us' is str '0', not an int"),
    (REQUEST, "no_merge", 0, "replays/7: field 'no_merge' is int 0, not a bool"),
    (REQUEST, "plan", "{}", "replays/7: field 'plan' is not a ReplayPlan (ValueError: replay plan JSON format "
                            "None is not 1)"),
    (WORKER, "inputs", "/a.logbuffer", "sites/s/workers/p/t/replays/7: field 'inputs' is str '/a.logbuffer', "
                                       "not a list"),
    (WORKER, "expect_eor", True, "sites/s/workers/p/t/replays/7: field 'expect_eor' is bool True, not an int"),
    (STATS, "channels", {"seven": 1}, "sites/s/replayers/3/stats: field 'channels' is dict {'seven': 1}, "
                                      "not a mapping of channel numbers"),
], ids=["since", "no_merge", "plan", "inputs", "expect_eor", "channels"])
def test_a_wrongly_typed_field_is_named_with_what_it_is(value, field, wrong, expected):
    with pytest.raises(ContractError) as caught:
        type(value).from_value(dict(value.to_value(), **{field: wrong}), KEYS[type(value)])
    assert str(caught.value) == expected


def test_a_nested_value_names_where_it_is():
    written = WORKER.to_value()
    written["also"] = [{"channel": 9}]
    with pytest.raises(ContractError, match=r"^sites/s/workers/p/t/replays/7: also\[0\]: missing field 'recipient'$"):
        WorkerReplay.from_value(written, KEYS[WorkerReplay])
    written = ASSIGNMENT.to_value()
    written["channels"][1]["until_us"] = 50
    with pytest.raises(ContractError, match=r"^sites/s/replayers/3: channels\[1\]: channel 8: empty range \[50, 50\)$"):
        ReplayerAssignment.from_value(written, KEYS[ReplayerAssignment])


def test_rules_across_fields_are_checked():
    with pytest.raises(ContractError, match=r"^sites/<site>/workers/.*: 2 inputs but 1 parents$"):
        WorkerReplay.from_value(dict(WORKER.to_value(), parents=["p/a"]))
    with pytest.raises(ContractError, match=r"^sites/<site>/replayers/<id>: no channels$"):
        ReplayerAssignment.from_value(dict(ASSIGNMENT.to_value(), channels=[]))
    with pytest.raises(ContractError, match=r"^replays/<channel>: empty range \[100, 100\)$"):
        ReplayRequest.from_value(dict(REQUEST.to_value(), since_us=100))
    with pytest.raises(ContractError, match=r"^replays/<channel>: summary: summary step of 0 s, not a positive"):
        ReplayRequest.from_value(dict(REQUEST.to_value(), summary={"step_s": 0}))
    with pytest.raises(ContractError, match=r"^sites/<site>/workers/.*: a replay via channel 3 has no inputs"):
        WorkerReplay.from_value(dict(WORKER.to_value(), via=3))


SERVED = ChannelRange(7, 0, 100, recipient="/ramen/replays/7.logbuffer", also=(Rider(9, "/ramen/replays/9.logbuffer"),),
                      summary=Summary(60, ("host",), ("bytes",)))
SERVING = ReplayerAssignment(3, "p/src", "/r/3.logbuffer", "/archive", (SERVED,), readers=0)


def test_a_channel_the_replayer_serves_reads_back_and_its_rules_are_checked():
    assert ReplayerAssignment.from_value(SERVING.to_value()) == SERVING and SERVED.served
    mixed = ReplayerAssignment(3, "p/src", "/r/3.logbuffer", "/archive", (SERVED, ChannelRange(8, 0, 100)), readers=1)
    assert ReplayerAssignment.from_value(mixed.to_value()) == mixed
    channel = SERVED.to_value()
    for broken, problem in [(dict(channel, summary=None), "a recipient and a summary go together"),
                            (dict(channel, recipient=None), "a recipient and a summary go together"),
                            (dict(channel, recipient=None, summary=None), "riders without a recipient"),
                            (dict(channel, tag=5), "a channel the replayer serves is not on its log")]:
        with pytest.raises(ContractError, match=rf"^sites/<site>/replayers/<id>: .*channel 7: {problem}"):
            ReplayerAssignment.from_value(dict(SERVING.to_value(), channels=[broken]))
    for readers, channels in [(1, [channel]), (0, [channel, ChannelRange(8, 0, 100).to_value()])]:
        with pytest.raises(ContractError, match=r"readers of its log: 0 exactly when the replayer serves every"):
            ReplayerAssignment.from_value(dict(SERVING.to_value(), readers=readers, channels=channels))
    with pytest.raises(ContractError, match=r"a lent replayer serves no channel itself"):
        ReplayerAssignment.from_value(dict(mixed.to_value(), sent_to="s2", stream_id=4))


def test_a_summarised_replay_of_a_source_here_goes_through_no_worker():
    source = ReplayPlan("p/src", 0, 100, ("p/src",), (), ("p/src",))
    request = ReplayRequest("p/src", 0, 100, source, "/r", created_us=0, timeout_s=1.0, no_merge=False,
                            summary=Summary(60))
    assert request.served_by_replayer and request.workers == ()
    assert not REQUEST.served_by_replayer and REQUEST.workers == PLAN.workers  # its target is not the source


def test_a_value_that_is_not_a_mapping_is_refused():
    with pytest.raises(ContractError, match=r"^replays/7: not a mapping but list \[1, 2\]$"):
        ReplayRequest.from_value([1, 2], "replays/7")


def test_unset_optional_fields_are_left_out_and_read_as_unset():
    written = WorkerReplay(7, 0, 100, ("/a",), expect_eor=1, parents=("p/a",)).to_value()
    assert written == {"channel": 7, "since_us": 0, "until_us": 100, "inputs": ["/a"], "expect_eor": 1,
                       "parents": ["p/a"], "pass_through": False, "carried": False}
    assert WorkerReplay.from_value(written).recipient is None


def test_the_first_error_of_a_request_stays_and_a_broken_request_gets_one_too():
    failed = with_error(REQUEST.to_value(), "replayer 3 of p/src died (exit 1)")
    assert ReplayRequest.from_value(failed).error == error_of(failed) == "replayer 3 of p/src died (exit 1)"
    assert error_of(REQUEST.to_value()) is None
    assert with_error({"target": "p/t"}, "no plan") == {"target": "p/t", "error": "no plan"}
    assert error_of(with_error("nonsense", "unreadable")) == "unreadable"
    assert not ReplayRequest.from_value(failed).lost
    lost = ReplayRequest.from_value(with_error(REQUEST.to_value(), "worker p/t died (killed by signal 9)", lost=True))
    assert lost.lost and lost.error == "worker p/t died (killed by signal 9)"
