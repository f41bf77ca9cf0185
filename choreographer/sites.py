"""Where functions run when several sites share the confserver, and the streams between sites.

A function placed on a site (`site = "edge"` in its program) runs there only; one not placed runs
on every site (each site its own copy, read by that site's children). A child whose parent does not
run on its own site reads the parent's output through netd: the parent's site sends it (a NetSend
of the parent's output log to the child's site's endpoint) and the child's site rebuilds it (a NetReceive
into `paths.received_log(site, parent)`, where the child's worker reads a parent placed elsewhere).

Each site's choreographer writes only its own site's keys, from the graph every choreographer
computes alike: its receives, and its sends to the sites whose netd announced an endpoint. It owns
the net/ keys named after functions (`<prog>/<func>` and `<prog>/<func>@<site>`); keys of other
names are someone else's (a test's, an operator's) and left alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx

from choreographer.graph import Usage
from ramen import keyspace, paths
from ramen.netd.contract import NetReceive, NetSend
from ramen.program import function_id
from ramen.transport.position import int32

SEND_SITE_SEPARATOR = "@"
LIVE_SEND_TETHER_HOLD_S = 60.0
"""A live stream sent to another site holds its writer this long for a receiving netd gone silent
(NetSend.tether_hold_s): a netd restarting (after up to 10 s of `ramen start`'s back-off, once it
died again and again) loses nothing of a stream nobody archives; one gone for good stops holding it
after this."""


def runs_on(graph: nx.DiGraph, name: str, site: str) -> bool:
    placed = graph.nodes[name]["function"].site
    return placed is None or placed == site


def sites_running(graph: nx.DiGraph, name: str, sites: set[str]) -> set[str]:
    """The sites among `sites` where function `name` runs."""
    placed = graph.nodes[name]["function"].site
    return set(sites) if placed is None else {placed} & sites


def stream_id(qualified_name: str) -> int:
    """The stream (and session) id of a function's output log: its id, as the log's int32 holds it."""
    return int32(function_id(qualified_name))


def net_keys(graph: nx.DiGraph, usage: Mapping[str, Usage], site: str,
             endpoints: Mapping[str, str]) -> dict[str, dict]:
    """The net/ keys of `site` and their values: a receive of every parent, running elsewhere, of
    a live function running here; a send of every live function running here to each other site
    with an endpoint (`endpoints`: site -> its endpoint channel) where a live child of it runs and
    it does not. Live, not only used: a replay reads archives, through replayers (whose streams
    across sites the supervisors wire), never the live streams."""
    keys: dict[str, dict] = {}
    for name in graph:
        if not runs_on(graph, name, site):
            continue
        if usage[name].live:
            for parent in graph.predecessors(name):
                if not runs_on(graph, parent, site):
                    keys[f"{keyspace.net_receives_prefix(site)}/{parent}"] = NetReceive(
                        stream_id=stream_id(parent), log=str(paths.received_log(site, parent))).to_value()
            for child in graph.successors(name):
                if not usage[child].live:
                    continue
                for other in sites_running(graph, child, set(endpoints) - {site}):
                    if runs_on(graph, name, other):
                        continue  # the child reads its own site's copy
                    keys[f"{keyspace.net_sends_prefix(site)}/{name}{SEND_SITE_SEPARATOR}{other}"] = NetSend(
                        log=str(paths.output_log(site, name)), channel=endpoints[other],
                        tether_hold_s=LIVE_SEND_TETHER_HOLD_S).to_value()
    return keys


def owned(key: str, site: str) -> bool:
    """A net/ key of `site` the choreographer wrote (named after a function), that it may delete."""
    for prefix in (keyspace.net_sends_prefix(site), keyspace.net_receives_prefix(site)):
        if key.startswith(prefix + "/"):
            return len(key[len(prefix) + 1:].split("/")) == 2
    return False
