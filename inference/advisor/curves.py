"""Costs between measured points: piecewise-linear curves and grids.

Why piecewise linear: the measurements are few (a handful of prompt lengths or batch sizes),
the costs they sample are monotone, and a straight line between two neighbours never
overshoots, never goes negative and passes exactly through every measured point. A spline
through five points can wiggle between them; a fitted model (DistServe fits prefill as
``a + b*tokens + c*tokens^2``) assumes a shape the measurements may not have on a CPU.

Outside the measured range:
- below the first point the first value holds: at small sizes a step's fixed overheads
  dominate, so the smallest measured cost is a floor, not something to extrapolate to zero;
- above the last point the last segment's slope goes on (never downwards): a prompt twice as
  long as the longest measured one must not cost the same as it;
- an axis with a single point means the cost does not depend on that quantity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inference.advisor.errors import InputError


@dataclass(frozen=True)
class Curve:
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def checked(cls, xs: Sequence[float], ys: Sequence[float], where: str) -> Curve:
        if len(xs) == 0:
            raise InputError(where, "needs at least one point")
        if len(xs) != len(ys):
            raise InputError(where, f"{len(xs)} x values but {len(ys)} measured values")
        if any(x < 0 for x in xs) or any(y < 0 for y in ys):
            raise InputError(where, "values must not be negative")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise InputError(where, "the points' x values must strictly increase")
        return cls(tuple(float(x) for x in xs), tuple(float(y) for y in ys))

    def __call__(self, x: float) -> float:
        # Hot path: called once or twice per simulated engine step.
        if len(self.xs) == 1 or x <= self.xs[-1]:
            return float(np.interp(x, self.xs, self.ys))
        slope = (self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2])
        return self.ys[-1] + max(slope, 0.0) * (x - self.xs[-1])


@dataclass(frozen=True)
class Grid:
    """A cost measured on rows (e.g. batch size) times columns (e.g. tokens): each row is a
    curve over the columns, and the rows' values at a column make a curve over the rows."""

    rows: tuple[float, ...]
    row_curves: tuple[Curve, ...]

    @classmethod
    def checked(cls, rows: Sequence[float], columns: Sequence[float],
                values: Sequence[Sequence[float]], where: str) -> Grid:
        Curve.checked(rows, [0.0] * len(rows), where)  # the row axis itself: increasing, >= 0
        if len(values) != len(rows):
            raise InputError(where, f"{len(rows)} rows on the axis but {len(values)} rows of values")
        curves = tuple(Curve.checked(columns, row, f"{where}[{i}]") for i, row in enumerate(values))
        return cls(tuple(float(r) for r in rows), curves)

    def __call__(self, row: float, column: float) -> float:
        return Curve(self.rows, tuple(curve(column) for curve in self.row_curves))(row)
