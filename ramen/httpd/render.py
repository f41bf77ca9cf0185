"""What `/render` and `/metrics/find` answer, given evaluated series or found nodes, in the formats
their clients read: JSON as Grafana's Graphite data source reads it, graphite-web's CSV, and the
pickle/msgpack a graphite-web reads from its CLUSTER_SERVERS (`local=1`), per graphite-web's
render/views.py, metrics/views.py, readers/remote.py and finders/remote.py.

Everything a pickle holds is a plain list, dict, str, int, float, bool or None: graphite-web
unpickles with a SafeUnpickler that refuses any class (numpy's floats included).
"""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
from collections.abc import Sequence
from datetime import datetime, timezone, tzinfo
from urllib.parse import unquote_plus

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ramen.arrow_text import text_bytes
from ramen.httpd.functions import consolidate_values
from ramen.httpd.names import Node
from ramen.httpd.series import Series

__all__ = ["FIND_FORMATS", "LOCAL_FORMATS", "Node", "consolidate", "to_csv", "to_find", "to_json", "to_local"]

LOCAL_FORMATS = ("pickle", "msgpack")
FIND_FORMATS = ("treejson", "completer", "json", "pickle", "msgpack")
PICKLE_PROTOCOL = 2
"""The newest protocol a Python 2 graphite-web (1.1.x still runs there) unpickles; Python 3 ones read it too."""
CSV_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
JSON_INFINITY = "1e9999"
"""How graphite-web writes an infinite value: valid JSON that JavaScript reads back as Infinity."""


def consolidate(series: Series, max_data_points: int, from_s: int, until_s: int) -> Series:
    """`series` with at most about `max_data_points` points over [from_s, until_s), by its own
    consolidation function, as graphite-web's JSON render does for Grafana's maxDataPoints.

    Bands are aligned to multiples of their width (secondsPerPoint) since the epoch, so a refresh a
    few seconds later consolidates the same points together (the chart does not jitter); the
    leading partial band is dropped, as graphite-web does. graphite-web moves the start a whole band
    even when it is aligned and drops one value fewer than it moves, which draws every value one step
    late; here each value stays in the band its time falls in. A one-point answer consolidates all.
    """
    if max_data_points < 1:
        raise ValueError(f"maxDataPoints must be >= 1, not {max_data_points}")
    if len(series.values) == 0:
        return series
    if max_data_points == 1:
        return series.copy(step=series.step * len(series.values),
                           values=consolidate_values(series.values, len(series.values), series.consolidate,
                                                     series.xfiles_factor))
    points = (until_s - from_s) / series.step
    if max_data_points >= points:
        return series
    values_per_point = math.ceil(points / max_data_points)
    seconds_per_point = values_per_point * series.step
    phase = series.start % series.step  # a series off the step grid keeps its offset
    first_band = -(-(series.start - phase) // seconds_per_point) * seconds_per_point + phase
    skipped = (first_band - series.start) // series.step
    return series.copy(start=first_band, step=seconds_per_point,
                       values=consolidate_values(series.values[skipped:], values_per_point, series.consolidate,
                                                 series.xfiles_factor))


def _time_range(series_list: Sequence[Series]) -> tuple[int, int]:
    """From the earliest start to the latest end: graphite-web's span for maxDataPoints."""
    return min(s.start for s in series_list), max(s.end for s in series_list)


def _datapoints(series_list: Sequence[Series]) -> list[pa.Buffer]:
    """Each series' points as JSON, `[value,epoch_s],…,`, formatted by Arrow for all the series at
    once: a chart of 50 hosts' seconds over an hour is 180,000 points, 0.12 s of Python a render
    but 0.03 s this way. Values in their shortest exact form (`3`, not `3.0`; still a float to
    JSON); null for NaN, JSON_INFINITY for infinities."""
    numbers = np.concatenate([s.values for s in series_list])
    values = pa.array(numbers)
    text = values.cast(pa.string())
    if not np.isfinite(numbers).all():  # a few compute calls more, for what JSON has no number for
        not_finite = pc.if_else(pc.is_nan(values), "null",
                                pc.if_else(pc.greater(values, 0), JSON_INFINITY, "-" + JSON_INFINITY))
        text = pc.if_else(pc.is_finite(values), text, not_finite)
    stamps = pa.array(np.concatenate([s.timestamps() for s in series_list])).cast(pa.string())
    points = pc.binary_join_element_wise("[", text, ",", stamps, "],", "")
    bounds = np.cumsum([0] + [len(s.values) for s in series_list])
    return [text_bytes(points.slice(start, end - start)) for start, end in zip(bounds, bounds[1:])]


def to_json(series_list: Sequence[Series], max_data_points: int | None = None) -> bytes:
    """`[{"target", "tags", "datapoints": [[value|null, epoch_s], ...]}, ...]`, as Grafana reads it.

    Values are floats (graphite-web's are too once stored); null for NaN, 1e9999 for infinity.
    """
    if not series_list:
        return b"[]"
    if max_data_points is not None:
        from_s, until_s = _time_range(series_list)
        series_list = [consolidate(s, max_data_points, from_s, until_s) for s in series_list]
    parts = []
    for s, points in zip(series_list, _datapoints(series_list)):
        parts += [b"," if parts else b"[",
                  f'{{"target":{json.dumps(s.name)},"tags":{json.dumps(s.tags)},"datapoints":['.encode(),
                  points[:-1] if len(points) else points, b"]}"]
    parts.append(b"]")
    return b"".join(parts)


def to_csv(series_list: Sequence[Series], tz: tzinfo = timezone.utc) -> bytes:
    """graphite-web's CSV: `name,YYYY-MM-DD HH:MM:SS,value` per point (time in `tz`, empty for null),
    excel dialect (CRLF)."""
    out = io.StringIO()
    writer = csv.writer(out, dialect="excel")
    for s in series_list:
        for value, timestamp in zip(s.values.tolist(), s.timestamps().tolist()):
            moment = datetime.fromtimestamp(timestamp, tz).strftime(CSV_TIME_FORMAT)
            writer.writerow((s.name, moment, "" if math.isnan(value) else value))
    return out.getvalue().encode()


def _plain_values(values: np.ndarray) -> list[float | None]:
    """Python floats with None for NaN (what pickle's and msgpack's readers take without classes)."""
    return [None if math.isnan(value) else value for value in values.tolist()]


def _series_info(s: Series) -> dict:
    """graphite-web's TimeSeries.getInfo(), which its RemoteReader reads back (it needs name, start,
    end, step and values; pathExpression groups the results), plus tags."""
    return {"name": s.name, "pathExpression": s.path_expression, "start": int(s.start), "end": int(s.end),
            "step": int(s.step), "values": _plain_values(s.values), "valuesPerPoint": 1,
            "consolidationFunc": s.consolidate, "xFilesFactor": s.xfiles_factor, "tags": dict(s.tags)}


def _serialize(payload: list, fmt: str) -> bytes:
    if fmt == "pickle":
        return pickle.dumps(payload, protocol=PICKLE_PROTOCOL)
    if fmt == "msgpack":
        return msgpack.packb(payload, use_bin_type=True)
    raise ValueError(f"unknown format {fmt!r} (known: {', '.join(LOCAL_FORMATS)})")


def to_local(series_list: Sequence[Series], fmt: str) -> bytes:
    """`/render?format=pickle|msgpack&local=1`: the series as a federating graphite-web reads them."""
    return _serialize([_series_info(s) for s in series_list], fmt)


def to_find(nodes: Sequence[Node], fmt: str, *, wildcards: bool = False, query: str = "") -> bytes:
    """`/metrics/find` of `query` in `fmt`: treejson (Grafana's query editor), completer, json, or
    pickle and msgpack as a federating graphite-web's RemoteFinder reads them. Nodes are sorted by
    name, as graphite-web sorts them; treejson lists branches before leaves, once per name, each
    with the id graphite-web gives it: the query up to its last level, then the node's name (for
    `a.*.bytes`, `a.*.bytes`, which expands to every match, not the first match's path), and with
    `wildcards` a leading `*` when there are several."""
    nodes = sorted(nodes, key=lambda node: node.name)
    if fmt == "treejson":
        return json.dumps(_tree_json(nodes, wildcards, query.rsplit(".", 1)[0] + "." if "." in query else "")
                          ).encode()
    if fmt == "completer":
        metrics = [{"path": node.path + ("" if node.leaf else "."), "name": node.name,
                    "is_leaf": str(int(node.leaf))} for node in nodes]
        if wildcards and len(metrics) > 1:
            metrics.append({"name": "*"})
        return json.dumps({"metrics": metrics}).encode()
    if fmt == "json":
        described = [{"path": node.path, "is_leaf": node.leaf,
                      **({"intervals": [{"start": start, "end": end} for start, end in node.intervals]}
                         if node.leaf else {})} for node in nodes]
        return json.dumps(sorted(described, key=lambda item: item["path"])).encode()
    if fmt in LOCAL_FORMATS:
        return _serialize([{"path": node.path, "is_leaf": node.leaf,
                            **({"intervals": [[int(start), int(end)] for start, end in node.intervals]}
                               if node.leaf else {})} for node in nodes], fmt)
    raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FIND_FORMATS)})")


_BRANCH = {"allowChildren": 1, "expandable": 1, "leaf": 0}
_LEAF = {"allowChildren": 0, "expandable": 0, "leaf": 1}


def _tree_json(nodes: Sequence[Node], wildcards: bool, base: str) -> list[dict]:
    branches, leaves, seen = [], [], set()
    tree: list[dict] = []
    if wildcards and len(nodes) > 1:
        tree.append({"text": "*", "id": base + "*", **(_BRANCH if any(not n.leaf for n in nodes) else _LEAF)})
    for node in nodes:
        if node.name in seen:
            continue
        seen.add(node.name)
        entry = {"text": unquote_plus(node.name), "id": base + node.name}
        (leaves if node.leaf else branches).append({**entry, **(_LEAF if node.leaf else _BRANCH)})
    return tree + branches + leaves
