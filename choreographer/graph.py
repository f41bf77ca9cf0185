"""The graph of every function of every loaded program, and who must run.

`is_used` (the choreographer's one decision) is true for
- every non-lazy function and every target of a tail, with all their ancestors: live output needs
  the whole live chain above it;
- every function on a replay's paths, from the archived functions that answer it (its sources) to
  its target, and only those: above the sources the data comes from the archive, so nothing there
  needs to run for the replay.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import networkx as nx

from ramen.program import Program
from ramen.worker_keys import WorkerSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Usage:
    """Why a function is used: live (non-lazy, tailed, or an ancestor of either), and which replays."""

    live: bool = False
    replays: frozenset[int] = field(default_factory=frozenset)

    @property
    def is_used(self) -> bool:
        return self.live or bool(self.replays)


def build_graph(programs: Iterable[Program]) -> nx.DiGraph:
    """Nodes are qualified names (with the Function as `function`); edges go parent → child.

    A parent that is not loaded (a program killed under another's feet) is logged and left out,
    so one broken link cannot stop every worker."""
    graph = nx.DiGraph()
    for program in programs:
        for function in program:
            graph.add_node(function.qualified_name, function=function)
    for program in programs:
        for parent, child in program.edges():
            if parent in graph:
                graph.add_edge(parent, child)
            else:
                log.warning("%s reads %s, which is not loaded", child, parent)
    return graph


def live_used(graph: nx.DiGraph, tail_targets: Iterable[str]) -> set[str]:
    roots = {name for name, data in graph.nodes(data=True) if not data["function"].lazy}
    roots.update(t for t in tail_targets if t in graph)
    used = set(roots)
    for name in roots:
        used |= nx.ancestors(graph, name)
    return used


def compute_usage(graph: nx.DiGraph, replays: Mapping[int, Iterable[str]],
                  tail_targets: Iterable[str] = ()) -> dict[str, Usage]:
    """Usage of every function in the graph. `replays` maps a channel to the functions on its paths
    (from its plan); functions no longer in the graph are ignored."""
    live = live_used(graph, tail_targets)
    by_function: dict[str, set[int]] = {name: set() for name in graph}
    for channel, functions in replays.items():
        for name in functions:
            if name in by_function:
                by_function[name].add(channel)
    return {name: Usage(name in live, frozenset(channels)) for name, channels in by_function.items()}


def worker_value(graph: nx.DiGraph, name: str, usage: Usage, program_versions: Mapping[str, str]) -> dict:
    """What the choreographer writes at a worker key (ramen.worker_keys.WorkerSpec), as written."""
    function = graph.nodes[name]["function"]
    return WorkerSpec(program=function.program, function=function.name, is_used=usage.is_used, live=usage.live,
                      replays=tuple(sorted(usage.replays)), lazy=function.lazy, kind=function.kind,
                      archived=function.archived, parents=tuple(sorted(graph.predecessors(name))),
                      children=tuple(sorted(graph.successors(name))), signature=function.signature,
                      program_version=program_versions[function.program]).to_value()
