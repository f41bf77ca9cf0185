"""What /render and /metrics/find write, read back by each format's reader, by graphite-web's own
readers where Debian's graphite-web can be imported, and maxDataPoints consolidation."""

import csv
import io
import json
import math
import pickle
from datetime import timedelta, timezone

import msgpack
import numpy as np
import pytest

from ramen.httpd.render import Node, consolidate, to_csv, to_find, to_json, to_local
from ramen.httpd.series import Series
from tests.httpd.graphite_web import graphite_modules

NAN = math.nan


def series(name, values, start=1_700_000_000, step=10, **kw):
    return Series(name=name, start=start, step=step, values=np.array(values, dtype=np.float64), **kw)


def same(actual, expected):
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        assert (a is None and e is None) or (a is not None and e is not None and
                                            ((math.isnan(a) and math.isnan(e)) or a == pytest.approx(e))), \
            (actual, expected)


# maxDataPoints consolidation


def test_no_consolidation_when_the_points_fit():
    s = series("a", [1, 2, 3, 4], start=0)
    assert consolidate(s, 4, 0, 40) is s


def test_bands_are_aligned_to_multiples_of_their_width_and_the_leading_partial_band_is_dropped():
    s = series("a", list(range(1, 13)), start=10, step=10)  # 10..120, 12 points
    result = consolidate(s, 4, 10, 130)  # 3 values per point, 30 s bands
    assert (result.start, result.step) == (30, 30)
    # value v is at 10*v: [30,60): 3,4,5 ; [60,90): 6,7,8 ; [90,120): 9,10,11 ; [120,150): 12 (partial tail kept)
    same(result.values.tolist(), [4, 7, 10, 12])


def test_a_refresh_later_puts_the_same_points_in_the_same_bands():
    values = np.arange(100, dtype=np.float64)
    first = consolidate(series("a", values[:60], start=0), 20, 0, 600)  # 0..590
    later = consolidate(series("a", values[2:62], start=20), 20, 20, 620)  # 20..610, 20 s later
    assert first.step == later.step == 30
    assert first.timestamps().tolist() == list(range(0, 600, 30))
    assert later.timestamps().tolist() == list(range(30, 630, 30))  # the partial band at 20 is dropped
    # every band both cover whole holds the same consolidated value
    assert first.values[1:].tolist() == later.values[:-1].tolist()


def test_consolidation_uses_the_series_function_and_all_null_bands_stay_null():
    s = series("a", [1, 2, NAN, NAN, 5, NAN], start=0, consolidate="sum")
    same(consolidate(s, 3, 0, 60).values.tolist(), [3, NAN, 5])
    s = series("a", [1, 2, NAN, NAN, 5, NAN], start=0, consolidate="max")
    same(consolidate(s, 3, 0, 60).values.tolist(), [2, NAN, 5])
    s = series("a", [1, 2, NAN, NAN, 5, NAN], start=0, consolidate="last")
    same(consolidate(s, 3, 0, 60).values.tolist(), [2, NAN, 5])
    s = series("a", [1, 2, NAN, NAN, 5, NAN], start=0, consolidate="avg_zero")
    same(consolidate(s, 3, 0, 60).values.tolist(), [1.5, NAN, 2.5])


def test_consolidation_takes_the_series_xfiles_factor():
    s = series("a", [1, NAN, NAN, 4, 5, 6], start=0)
    same(consolidate(s, 2, 0, 60).values.tolist(), [1, 5])
    same(consolidate(series("a", s.values, start=0, xfiles_factor=0.5), 2, 0, 60).values.tolist(), [NAN, 5])
    same(consolidate(series("a", s.values, start=0, xfiles_factor=0.5), 1, 0, 60).values.tolist(), [4])


def test_one_data_point_consolidates_everything():
    s = series("a", [1, 2, 3, NAN], start=0)
    result = consolidate(s, 1, 0, 40)
    assert (result.start, result.step) == (0, 40)
    same(result.values.tolist(), [2])


def test_bad_max_data_points_is_refused():
    with pytest.raises(ValueError, match="maxDataPoints must be >= 1, not 0"):
        consolidate(series("a", [1]), 0, 0, 10)


# JSON, CSV


def test_json_is_what_grafana_reads_with_null_for_nan():
    s = series("prog.f.x", [1.5, NAN, 3], start=100, tags={"name": "prog.f.x", "host": "h1"})
    answer = json.loads(to_json([s]))
    assert answer == [{"target": "prog.f.x", "tags": {"name": "prog.f.x", "host": "h1"},
                       "datapoints": [[1.5, 100], [None, 110], [3.0, 120]]}]
    assert all(isinstance(point[1], int) for point in answer[0]["datapoints"])


def test_json_writes_infinity_as_graphite_does_and_names_with_quotes():
    s = series('alias(a,"q\\"")', [math.inf, -math.inf], start=0)
    raw = to_json([s])
    assert b"Infinity" not in raw
    assert json.loads(raw)[0]["datapoints"] == [[math.inf, 0], [-math.inf, 10]]
    assert json.loads(raw)[0]["target"] == 'alias(a,"q\\"")'


def test_json_values_read_back_exactly_in_every_series_even_an_empty_one():
    values = [0.1, 1 / 3, 1e-7, 1e20, -0.0, 2.0 ** 53, 123456789012345678.0, 5.0, -2.5e-300]
    written = [series("a", values, start=0), series("empty", [], start=0), series("b", values[::-1], start=5)]
    answer = json.loads(to_json(written))
    assert [entry["target"] for entry in answer] == ["a", "empty", "b"]
    assert answer[1]["datapoints"] == []
    for entry, s in zip(answer, written):
        assert [point[0] for point in entry["datapoints"]] == s.values.tolist()
        assert [point[1] for point in entry["datapoints"]] == s.timestamps().tolist()


def test_json_max_data_points_consolidates_over_the_span_of_all_series():
    short = series("short", [1, 2, 3, 4], start=0)
    long = series("long", list(range(12)), start=0)
    answer = {entry["target"]: entry["datapoints"] for entry in json.loads(to_json([short, long], 4))}
    assert answer["long"] == [[1.0, 0], [4.0, 30], [7.0, 60], [10.0, 90]]
    assert answer["short"] == [[2.0, 0], [4.0, 30]]  # 3 per point as well: the span is 120 s


def test_empty_answer():
    assert json.loads(to_json([], 100)) == []
    assert to_csv([]) == b""


def test_csv_lines_are_name_time_value_with_empty_nulls():
    s = series("prog.f.x", [1.5, NAN], start=1_700_000_000)
    rows = list(csv.reader(io.StringIO(to_csv([s]).decode())))
    assert rows == [["prog.f.x", "2023-11-14 22:13:20", "1.5"], ["prog.f.x", "2023-11-14 22:13:30", ""]]
    assert to_csv([s]).count(b"\r\n") == 2
    paris = timezone(timedelta(hours=1))
    assert to_csv([s], paris).split(b",")[1] == b"2023-11-14 23:13:20"


# pickle / msgpack for federation


def test_local_pickle_and_msgpack_hold_what_graphite_webs_remote_reader_reads():
    s = series("prog.f.x", [1.0, NAN, 3.0], start=100, step=10, path_expression="prog.f.*", consolidate="max",
               xfiles_factor=0.5)
    for fmt, load in (("pickle", pickle.loads), ("msgpack", lambda b: msgpack.unpackb(b, raw=False))):
        [info] = load(to_local([s], fmt))
        assert info == {"name": "prog.f.x", "pathExpression": "prog.f.*", "start": 100, "end": 130, "step": 10,
                        "values": [1.0, None, 3.0], "valuesPerPoint": 1, "consolidationFunc": "max",
                        "xFilesFactor": 0.5, "tags": {"name": "prog.f.x"}}, fmt
        assert type(info["start"]) is int and type(info["values"][0]) is float


def test_unknown_formats_are_refused():
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        to_local([], "xml")
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        to_find([], "xml")


# /metrics/find


NODES = [Node("prog.f.x", True, [(100, 200)]), Node("prog.f.h%2E1", False), Node("prog.f.a", True, [(0, 50), (60, 70)])]


def test_treejson_lists_branches_first_then_leaves_sorted_by_name():
    assert json.loads(to_find(NODES, "treejson", query="prog.f.*")) == [
        {"text": "h.1", "id": "prog.f.h%2E1", "leaf": 0, "expandable": 1, "allowChildren": 1},
        {"text": "a", "id": "prog.f.a", "leaf": 1, "expandable": 0, "allowChildren": 0},
        {"text": "x", "id": "prog.f.x", "leaf": 1, "expandable": 0, "allowChildren": 0},
    ]
    with_wildcard = json.loads(to_find(NODES, "treejson", wildcards=True, query="prog.f.*"))
    assert with_wildcard[0] == {"text": "*", "id": "prog.f.*", "leaf": 0, "expandable": 1, "allowChildren": 1}


def test_treejson_ids_are_the_query_up_to_its_last_level_then_the_name_as_graphite_webs():
    """A glob before the last level: the id was the first match's path, so expanding it in
    Grafana's editor lost the other matches (graphite-web 1.1.10's find_view: base_path + name)."""
    bytes_of = [Node("a.b.host01.bytes", True, [(0, 10)]), Node("a.b.host02.bytes", True, [(0, 10)])]
    assert json.loads(to_find(bytes_of, "treejson", query="a.b.host0[12].bytes")) == [
        {"text": "bytes", "id": "a.b.host0[12].bytes", "leaf": 1, "expandable": 0, "allowChildren": 0}]
    assert json.loads(to_find([Node("net", False)], "treejson", query="*"))[0]["id"] == "net"


def test_completer_marks_branches_with_a_trailing_dot_and_leaf_as_a_string():
    assert json.loads(to_find(NODES, "completer")) == {"metrics": [
        {"path": "prog.f.a", "name": "a", "is_leaf": "1"},
        {"path": "prog.f.h%2E1.", "name": "h%2E1", "is_leaf": "0"},
        {"path": "prog.f.x", "name": "x", "is_leaf": "1"},
    ]}


def test_find_json_pickle_and_msgpack_give_intervals_of_leaves_only():
    expected = [{"path": "prog.f.a", "is_leaf": True, "intervals": [[0, 50], [60, 70]]},
                {"path": "prog.f.h%2E1", "is_leaf": False},
                {"path": "prog.f.x", "is_leaf": True, "intervals": [[100, 200]]}]
    assert pickle.loads(to_find(NODES, "pickle")) == expected
    assert msgpack.unpackb(to_find(NODES, "msgpack"), raw=False) == expected
    assert json.loads(to_find(NODES, "json"))[0] == {"path": "prog.f.a", "is_leaf": True,
                                                     "intervals": [{"start": 0, "end": 50}, {"start": 60, "end": 70}]}


# graphite-web's own readers and views


@pytest.fixture(scope="module")
def graphite():
    """Debian's graphite-web, when importable: its unpickler, finder, bundled msgpack and views."""
    util, remote, intervals, views, datalib = graphite_modules(
        "graphite.util", "graphite.finders.remote", "graphite.intervals", "graphite.render.views",
        "graphite.render.datalib")
    RemoteFinder, Interval, IntervalSet, TimeSeries = (remote.RemoteFinder, intervals.Interval,
                                                       intervals.IntervalSet, datalib.TimeSeries)
    return {"unpickle": util.unpickle, "RemoteFinder": RemoteFinder, "msgpack": util.msgpack, "views": views,
            "TimeSeries": TimeSeries, "Interval": Interval, "IntervalSet": IntervalSet}


def test_graphite_webs_safe_unpickler_and_remote_finder_read_our_render_pickle(graphite):
    s = series("prog.f.x", [1.0, NAN, 3.0], start=100, path_expression="prog.f.*")
    data = graphite["RemoteFinder"]._deserialize_buffer(to_local([s], "pickle"), "application/pickle")
    # what graphite-web's RemoteReader.fetch_multi takes from each entry
    assert [(d["pathExpression"], d["name"], (d["start"], d["end"], d["step"]), d["values"]) for d in data] == \
        [("prog.f.*", "prog.f.x", (100, 130, 10), [1.0, None, 3.0])]


def test_graphite_webs_msgpack_reads_our_render_msgpack(graphite):
    # graphite-web's RemoteFinder passes encoding="utf-8", which msgpack >= 1.0 no longer takes (and its
    # bundled umsgpack fails on Python >= 3.10): read with the msgpack graphite.util imports, as 1.0 reads utf-8.
    s = series("prog.f.x", [1.0, NAN], start=100)
    [info] = graphite["msgpack"].unpackb(to_local([s], "msgpack"), raw=False)
    assert (info["name"], info["start"], info["end"], info["step"], info["values"]) == \
        ("prog.f.x", 100, 120, 10, [1.0, None])


def test_graphite_webs_remote_finder_builds_nodes_from_our_find_pickle_and_msgpack(graphite):
    Interval, IntervalSet = graphite["Interval"], graphite["IntervalSet"]
    for data in (graphite["RemoteFinder"]._deserialize_buffer(to_find(NODES, "pickle"), "application/pickle"),
                 graphite["msgpack"].unpackb(to_find(NODES, "msgpack"), raw=False)):
        built = []
        for info in data:  # as RemoteFinder.find_nodes reads each entry
            intervals = IntervalSet([Interval(i[0], i[1]) for i in info.get("intervals") or []])
            built.append((info["path"], info["is_leaf"], [interval.tuple for interval in intervals]))
        assert built == [("prog.f.a", True, [(0, 50), (60, 70)]), ("prog.f.h%2E1", False, []),
                         ("prog.f.x", True, [(100, 200)])]


def test_graphite_webs_unpickler_refuses_what_it_does_not_know_so_we_send_plain_types(graphite):
    with pytest.raises(pickle.UnpicklingError):
        graphite["unpickle"].loads(pickle.dumps([np.float64(1.0)], protocol=2))
    graphite["unpickle"].loads(to_local([series("a", [np.float64(1.0)])], "pickle"))


def _their_series(graphite, s):
    their = graphite["TimeSeries"](s.name, s.start, s.end, s.step,
                                   [None if math.isnan(v) else v for v in s.values.tolist()],
                                   tags=dict(s.tags), xFilesFactor=0)
    their.pathExpression = s.path_expression
    return their


def test_same_json_csv_and_pickle_as_graphite_webs_render_views(graphite):
    views = graphite["views"]
    ours = [series("prog.f.x", [1.5, NAN, 3.0, 4.0]), series("prog.f.y", [NAN, 2.0, 0.0, -1.0], start=1_700_000_010)]
    options = {"tzinfo": timezone.utc}
    assert json.loads(to_json(ours)) == json.loads(views.renderViewJson(options, [_their_series(graphite, s)
                                                                                 for s in ours]).content)
    assert to_csv(ours) == views.renderViewCsv(options, [_their_series(graphite, s) for s in ours]).content
    theirs = pickle.loads(views.renderViewPickle(options, [_their_series(graphite, s) for s in ours]).content)
    assert [{k: v for k, v in info.items() if k != "tags"} for info in pickle.loads(to_local(ours, "pickle"))] == theirs


def test_graphite_web_consolidates_as_we_do_but_one_step_late(graphite):
    """graphite-web's bands are ours for the same values each drawn one step later (its nudge moves
    the start one step more than the values it drops)."""
    views = graphite["views"]
    ours = series("a", list(range(1, 25)), start=1_700_000_000 + 10)
    theirs = json.loads(views.renderViewJson({"maxDataPoints": 5}, [_their_series(graphite, ours)]).content)
    [mine] = json.loads(to_json([ours], 5))
    assert [t % 50 for _v, t in mine["datapoints"]] == [0] * 4  # 5 values per point, 50 s bands
    assert mine["datapoints"][0] == [7.0, 1_700_000_050]  # values 5..9, at 50..90
    [one_step_late] = json.loads(to_json([ours.copy(start=ours.start + ours.step)], 5))
    assert one_step_late["datapoints"] == theirs[0]["datapoints"]
