"""What the choreographer did, as counters in the site's counters file (`ramen stat`), read by
tests as attributes."""

from __future__ import annotations

from ramen.transport.service_counters import Count, ServiceCounters


class ChoreographerCounters(ServiceCounters, service="choreographer"):
    recomputes = Count("Whole-graph recomputes (a program, tail or ended replay changed).")
    fast_paths = Count("New replays marked used at once, without a recompute.")
    writes = Count("Worker keys written.")
    deletes = Count("Worker keys deleted (functions that no longer exist).")
    bad_programs = Count("Program keys that could not be read (the program before them kept).")
