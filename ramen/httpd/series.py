"""A time series as graphite-web knows it: what `/render` fetches, what target functions take
and return, and what the output formats write.

Values sit in a float64 numpy array, NaN standing for Graphite's null (no value in that step), so
functions work on whole arrays. Point i covers [start + i*step, start + (i+1)*step); `end` is
exclusive, as in graphite-web.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

CONSOLIDATIONS = ("average", "sum", "min", "max", "first", "last", "avg", "avg_zero", "median", "multiply")
"""The consolidation functions `consolidateBy` accepts, as graphite-web names them."""
DEFAULT_CONSOLIDATION = "average"
DEFAULT_XFILES_FACTOR = 0.0
"""graphite-web's default: one non-null value among those reduced is enough for a non-null result."""


@dataclass
class Series:
    name: str
    """What the series is called in the answer: the metric path, or what a function made of it."""
    start: int
    """Epoch seconds of the first point."""
    step: int
    """Seconds between points (> 0)."""
    values: np.ndarray
    """float64, NaN where there is no value."""
    path_expression: str = ""
    """The path expression of the target it came from (graphite-web's pathExpression)."""
    tags: dict[str, str] = field(default_factory=dict)
    """graphite-web's tags: at least {"name": <metric path>} for a plain metric."""
    consolidate: str = DEFAULT_CONSOLIDATION
    """How to consolidate points when there are more than maxDataPoints (consolidateBy sets it)."""
    xfiles_factor: float = DEFAULT_XFILES_FACTOR
    """Share of non-null values a reduction of its points needs for a non-null result (graphite-web's
    xFilesFactor): the render's `xFilesFactor`, or what setXFilesFactor set; consolidation, summarize,
    movingAverage and the series functions over it use it unless told another."""

    def __post_init__(self) -> None:
        if self.step <= 0:
            raise ValueError(f"series {self.name}: step must be > 0 s, not {self.step}")
        self.values = np.asarray(self.values, dtype=np.float64)
        if not self.path_expression:
            self.path_expression = self.name
        if not self.tags:
            self.tags = {"name": self.name}

    @property
    def end(self) -> int:
        return self.start + self.step * len(self.values)

    def timestamps(self) -> np.ndarray:
        """Epoch seconds of each point's start, as int64."""
        return self.start + self.step * np.arange(len(self.values), dtype=np.int64)

    def copy(self, **changes) -> Series:
        """A new series sharing nothing mutable with this one, with `changes` applied."""
        changes.setdefault("values", self.values.copy())
        changes.setdefault("tags", dict(self.tags))
        return replace(self, **changes)


class SeriesLists(list):
    """Lists of series (mapSeries' groups), a value of their own: only a function that takes them
    (reduceSeries) may be given them; any other says so in one line, as it would a literal where a
    series list belongs, instead of failing on a list where a series was."""
