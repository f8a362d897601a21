"""The cost clock: a step's time computed from its work, the same model for every lane.

Wall-clock time makes a race's verdict depend on the machine's noise (another process, the
CPU's clock, the order the lanes ran in). On the cost clock a forward pass costs

    fixed + per_row x rows + per_token x tokens computed + per_kv x K/V tokens attention reads

with the coefficients fitted on this machine (``fit``, from passes timed on the wall clock),
so the same race gives the same figures every time, and two schedules are compared by the
work they do, not by when they ran. No torch: the lanes describe their passes (``PassWork``),
this module prices them. Simulators such as Vidur model both scheduler and cost; here the
scheduler is the real one and only the cost is modelled.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

CHOICES = ("reference", "measure")  # what --cost-profile takes besides a file (race/calibrate.py)


@dataclass(frozen=True)
class PassWork:
    """One forward pass's work: rows in the batch (computed, wasted ones included), tokens
    computed (prompt chunks and padding included) and the context tokens its attention reads."""

    rows: int
    tokens: int
    kv_tokens: int
    passes: int = 1  # a step's work is its passes' sum (each pass pays the fixed cost)

    @classmethod
    def of_rows(cls, rows) -> PassWork:
        """A ragged pass's work from its rows (anything, start, n): each row computes n tokens
        and its attention reads the row's context up to start + n."""
        return cls(len(rows), sum(n for _, _, n in rows), sum(start + n for _, start, n in rows))

    def __add__(self, other: PassWork) -> PassWork:
        return PassWork(
            self.rows + other.rows,
            self.tokens + other.tokens,
            self.kv_tokens + other.kv_tokens,
            self.passes + other.passes,
        )


@dataclass(frozen=True)
class CostModel:
    """Seconds per pass as a linear function of its work (see the module docstring)."""

    fixed_s: float
    per_row_s: float
    per_token_s: float
    per_kv_token_s: float
    source: str = "fitted"  # where the coefficients came from (a machine, a file)

    def cost(self, work: PassWork) -> float:
        """The pass's seconds, rounded to the nanosecond so sums are exact across runs."""
        s = self.fixed_s * work.passes + self.per_row_s * work.rows + self.per_token_s * work.tokens
        return round(s + self.per_kv_token_s * work.kv_tokens, 9)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """A profile written by ``to_json`` (measured here or elsewhere, e.g. on a GPU); a file that
        is not one is a ValueError naming it."""
        try:
            values = json.loads(Path(path).read_text())
            model = cls(**values)
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: not a cost profile ({type(e).__name__}: {e})") from None
        coefs = (model.fixed_s, model.per_row_s, model.per_token_s, model.per_kv_token_s)
        if not all(isinstance(c, (int, float)) and math.isfinite(c) and c >= 0 for c in coefs):
            raise ValueError(f"{path}: a cost profile's coefficients are finite numbers >= 0, got {coefs}")
        return model


def fit(samples: list[tuple[PassWork, float]], source: str = "fitted") -> CostModel:
    """Least squares over (work, measured seconds), coefficients kept >= 0 (a term that fits
    negative is dropped and the rest refitted: time never falls with more work)."""
    if len(samples) < 4:
        raise ValueError(f"a cost fit needs at least 4 timed passes, got {len(samples)}")
    terms = [0, 1, 2, 3]
    while True:
        coefs = _least_squares([[_feature(w, t) for t in terms] for w, _ in samples], [s for _, s in samples])
        if all(c >= 0 for c in coefs) or len(terms) == 1:
            break
        terms.pop(min(range(len(terms)), key=lambda i: coefs[i]))
    full = [0.0] * 4
    for t, c in zip(terms, coefs):
        full[t] = max(0.0, c)
    return CostModel(*full, source=source)


def fit_error(model: CostModel, samples: list[tuple[PassWork, float]]) -> tuple[float, float]:
    """(median, p95) of |model - measured| / measured over the samples: how well the model fits."""
    errs = sorted(abs(model.cost(w) - s) / s for w, s in samples if s > 0)
    if not errs:
        return 0.0, 0.0
    return statistics.median(errs), errs[min(len(errs) - 1, math.ceil(0.95 * len(errs)) - 1)]


def _feature(w: PassWork, term: int) -> float:
    return (float(w.passes), float(w.rows), float(w.tokens), float(w.kv_tokens))[term]


def _least_squares(x: list[list[float]], y: list[float]) -> list[float]:
    """Solve the normal equations (X^T X) b = X^T y by Gaussian elimination (a few unknowns)."""
    n = len(x[0])
    a = [[sum(r[i] * r[j] for r in x) for j in range(n)] + [sum(r[i] * v for r, v in zip(x, y))] for i in range(n)]
    for i in range(n):
        a[i][i] += 1e-12 * (1 + a[i][i])  # (a term that never varies would leave the system singular)
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[p] = a[p], a[i]
        for r in range(n):
            if r != i and a[i][i] != 0:
                f = a[r][i] / a[i][i]
                a[r] = [u - f * v for u, v in zip(a[r], a[i])]
    return [a[i][n] / a[i][i] if a[i][i] else 0.0 for i in range(n)]
