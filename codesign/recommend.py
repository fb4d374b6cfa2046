"""Frontiers and selection over stored results: ordinary code over the result table.

InferenceX draws, per configuration, throughput against interactivity over its operating points (concurrency x
parallel mapping) and compares systems on the upper-right frontier. Here:

- :func:`pareto_frontier` keeps the points no other point beats on both interactivity and throughput;
- :func:`value_at` reads a frontier at a target interactivity by linear interpolation between the two frontier
  points around it (NaN when the design cannot reach that interactivity);
- :func:`design_values` does that for every design of a table, and :func:`recommend` ranks the candidates of
  each generation at every target and computes their gains over the baseline and the competitors.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa


def pareto_frontier(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the maximal points (maximise x and y), ordered by increasing x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if not len(ok):
        return ok
    order = ok[np.lexsort((-y[ok], -x[ok]))]  # x descending, ties: larger y first
    keep, best = [], -np.inf
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    return np.asarray(keep[::-1], dtype=np.int64)


def value_at(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """Throughput on the frontier of (x, y) at interactivity ``target`` (linear interpolation); NaN if unreachable."""
    idx = pareto_frontier(x, y)
    if not len(idx):
        return float("nan")
    fx, fy = np.asarray(x, float)[idx], np.asarray(y, float)[idx]
    if target > fx[-1]:
        return float("nan")
    if target <= fx[0]:
        return float(fy[0])
    j = int(np.searchsorted(fx, target))
    t = (target - fx[j - 1]) / (fx[j] - fx[j - 1])
    return float(fy[j - 1] + t * (fy[j] - fy[j - 1]))


def columns(table: pa.Table, names) -> dict[str, np.ndarray]:
    return {n: table.column(n).to_numpy(zero_copy_only=False) for n in names}


@dataclasses.dataclass
class DesignSummary:
    design_id: str
    name: str
    kind: str
    generation: str
    values: dict[float, float]  # target interactivity -> objective on the frontier
    per_chip: dict[float, float]
    max_interactivity: float
    best_objective: float
    row: dict  # design parameters and chip figures (first row of the design)


def design_values(table: pa.Table, objective: str, targets) -> list[DesignSummary]:
    cols = columns(table, ["design_id", "name", "kind", "generation", "feasible", "interactivity_tok_s_user",
                           objective, "total_tok_s_per_chip"])
    out = []
    order = np.argsort(cols["design_id"], kind="stable")
    ids = cols["design_id"][order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    names = table.column_names
    for s, e in zip(starts, ends):
        rows = order[s:e]
        feas = rows[cols["feasible"][rows].astype(bool)]
        x = cols["interactivity_tok_s_user"][feas].astype(float)
        y = cols[objective][feas].astype(float)
        yc = cols["total_tok_s_per_chip"][feas].astype(float)
        first = int(rows[0])
        row = {n: table.column(n)[first].as_py() for n in names}
        out.append(DesignSummary(
            design_id=str(ids[s]), name=str(cols["name"][first]), kind=str(cols["kind"][first]),
            generation=str(cols["generation"][first]),
            values={t: value_at(x, y, t) for t in targets},
            per_chip={t: value_at(x, yc, t) for t in targets},
            max_interactivity=float(np.max(x)) if len(x) else float("nan"),
            best_objective=float(np.max(y)) if len(y) else float("nan"),
            row=row))
    return out


@dataclasses.dataclass
class Recommendation:
    objective: str
    targets: tuple
    headline_target: float
    baseline: DesignSummary | None
    competitors: list[DesignSummary]
    ranked: dict[str, dict[float, list[DesignSummary]]]  # generation -> target -> best first
    best: dict[str, DesignSummary | None]  # generation -> best at the headline target
    infeasible: dict[str, int]  # generation -> designs infeasible by construction
    unreachable: dict[str, int]  # generation -> feasible designs that cannot reach the headline target

    def gain(self, design: DesignSummary, other: DesignSummary | None, target: float | None = None) -> float:
        t = self.headline_target if target is None else target
        if design is None or other is None:
            return float("nan")
        a, b = design.values[t], other.values[t]
        return a / b if np.isfinite(a) and np.isfinite(b) and b > 0 else float("nan")


def recommend(table: pa.Table, objective: str, targets, top_k: int) -> Recommendation:
    targets = tuple(float(t) for t in targets)
    headline = targets[len(targets) // 2]
    summaries = design_values(table, objective, targets)
    baseline = next((d for d in summaries if d.kind == "baseline"), None)
    competitors = [d for d in summaries if d.kind == "competitor"]
    gens = sorted({d.generation for d in summaries if d.kind == "candidate"})
    ranked, best, infeasible, unreachable = {}, {}, {}, {}
    for g in gens:
        cands = [d for d in summaries if d.kind == "candidate" and d.generation == g]
        infeasible[g] = sum(1 for d in cands if not np.isfinite(d.max_interactivity))
        unreachable[g] = sum(1 for d in cands if np.isfinite(d.max_interactivity)
                             and not np.isfinite(d.values[headline]))
        ranked[g] = {}
        for t in targets:
            ok = [d for d in cands if np.isfinite(d.values[t])]
            ranked[g][t] = sorted(ok, key=lambda d: (-d.values[t], d.design_id))[:top_k]
        best[g] = ranked[g][headline][0] if ranked[g][headline] else None
    return Recommendation(objective, targets, headline, baseline, competitors, ranked, best, infeasible, unreachable)
