"""Frontiers over stored results: ordinary code over the result table (:mod:`codesign.recommend` selects on them).

InferenceX draws, per configuration, throughput against interactivity over its operating points (concurrency x
parallel mapping) and compares systems on the upper-right frontier. Here:

- :func:`pareto_frontier` keeps the points no other point beats on both interactivity and throughput;
- :func:`value_at` reads a frontier at a target interactivity by linear interpolation between the two frontier
  points around it (NaN when the design cannot reach that interactivity); :func:`frontier_interp` reads any other
  column along the same frontier (the E2E latency of the operating points the frontier is made of);
- :func:`design_values` does that for every (design, workload) of a table: the objective, tokens/s per chip, per
  kW of rating, per $ and the E2E latency at every target, and the design's lowest E2E latency
  (:class:`DesignSummary`).

The agent-chain latency compares designs at their lowest-latency operating points (the schema's
``min_e2e_latency_s``), not at the target: at matched interactivity every design has the same TPOT, so a chain's
latency there differs only by TTFT and its gains come out ~1.00x by construction, which says nothing about a chip.

Everything works from each design's frontier rows alone (what big sweeps store): a frontier of the frontier is the
frontier. Design-space axes are discovered from the ``design_*`` columns, never listed here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

# Objectives the selection can rank on: a result column (higher is better) or a derived one.
DERIVED = {"tok_per_usd": "usd_per_mtok", "tok_per_joule": "joules_per_token"}
OBJECTIVE_LABEL = {
    "total_tok_s_per_kw": "total tokens/s per kW of chip rating",
    "total_tok_s_per_chip": "total tokens/s per chip",
    "output_tok_s_per_chip": "output tokens/s per chip",
    "total_tok_s_per_sustained_kw": "total tokens/s per sustained kW",
    "total_tok_s_per_allin_kw": "total tokens/s per all-in kW",
    "tok_per_usd": "tokens per $",
    "tok_per_joule": "tokens per J",
}
# The comparison metrics (generation over generation): key -> (label, unit, higher is better)
GAIN_METRICS = {
    "per_chip": ("tokens/s per chip", "tok/s", True),
    "per_kw": ("tokens/s per kW (chip rating)", "tok/s/kW", True),
    "per_usd": ("tokens per $", "tok/$", True),
    "chain_latency": ("agent-chain latency at the fastest point", "s", False),
}
X = "interactivity_tok_s_user"


def pareto_frontier(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the maximal points (maximise x and y), ordered by increasing x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if not len(ok):
        return ok
    order = ok[np.lexsort((-y[ok], -x[ok]))]  # x descending, ties: larger y first
    ys = y[order]
    best_before = np.r_[-np.inf, np.maximum.accumulate(ys)[:-1]]
    keep = order[ys > best_before]
    return np.asarray(keep[::-1], dtype=np.int64)


def _interp(fx: np.ndarray, fz: np.ndarray, target: float) -> float:
    """Linear interpolation along a frontier with increasing x; the first point below it, NaN above its end."""
    if not len(fx) or not np.isfinite(target) or target > fx[-1]:
        return float("nan")
    if target <= fx[0]:
        return float(fz[0])
    j = int(np.searchsorted(fx, target))
    t = (target - fx[j - 1]) / (fx[j] - fx[j - 1])
    return float(fz[j - 1] + t * (fz[j] - fz[j - 1]))


def value_at(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """Throughput on the frontier of (x, y) at interactivity ``target`` (linear interpolation); NaN if unreachable."""
    idx = pareto_frontier(x, y)
    if not len(idx):
        return float("nan")
    return _interp(np.asarray(x, float)[idx], np.asarray(y, float)[idx], target)


def frontier_interp(x: np.ndarray, y: np.ndarray, z: np.ndarray, target: float) -> float:
    """Column ``z`` read along the (x, y) frontier at interactivity ``target`` (as :func:`value_at` reads y)."""
    idx = pareto_frontier(x, y)
    if not len(idx):
        return float("nan")
    return _interp(np.asarray(x, float)[idx], np.asarray(z, float)[idx], target)


def columns(table: pa.Table, names) -> dict[str, np.ndarray]:
    return {n: table.column(n).to_numpy(zero_copy_only=False) for n in names}


def _col(table: pa.Table, name: str, dtype=float) -> np.ndarray:
    if name in table.column_names:
        v = table.column(name).to_numpy(zero_copy_only=False)
        return v.astype(dtype) if dtype is not None else v
    return np.full(table.num_rows, np.nan)


def objective_values(table: pa.Table, objective: str) -> np.ndarray:
    """The objective per row, higher is better (``tok_per_usd`` = 1e6 / usd_per_mtok, ``tok_per_joule``)."""
    if objective in DERIVED:
        src = _col(table, DERIVED[objective])
        scale = 1e6 if objective == "tok_per_usd" else 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(src > 0, scale / src, np.nan)
    if objective not in table.column_names:
        raise KeyError(f"objective {objective!r} is not a result column (columns: {', '.join(table.column_names)})")
    return _col(table, objective)


def design_axes(table_or_names) -> list[str]:
    """The design-space axes present: every ``design_<axis>`` column (``design_id`` excepted)."""
    names = table_or_names.column_names if isinstance(table_or_names, pa.Table) else list(table_or_names)
    return [n[len("design_"):] for n in names if n.startswith("design_") and n != "design_id"]


@dataclasses.dataclass
class DesignSummary:
    """One design on one workload: its frontier read at each target interactivity."""
    design_id: str
    name: str
    kind: str
    generation: str
    values: dict[float, float]  # target interactivity -> objective on the frontier
    per_chip: dict[float, float]
    max_interactivity: float
    best_objective: float
    row: dict  # design parameters and chip figures (first row of the design)
    workload: str = ""
    per_kw: dict[float, float] = dataclasses.field(default_factory=dict)
    tok_per_usd: dict[float, float] = dataclasses.field(default_factory=dict)  # 1e6 / usd_per_mtok
    e2e_s: dict[float, float] = dataclasses.field(default_factory=dict)  # E2E of the frontier point at the target
    min_e2e_s: float = float("nan")  # lowest E2E latency over the design's feasible stored operating points

    def metric(self, metric: str, target: float, chain_steps: int = 1) -> float:
        """A comparison metric (GAIN_METRICS key, or "objective") at ``target``; the chain latency is
        ``chain_steps`` dependent requests at the design's lowest-latency point, whatever the target."""
        if metric == "objective":
            return self.values.get(target, float("nan"))
        if metric == "per_chip":
            return self.per_chip.get(target, float("nan"))
        if metric == "per_kw":
            return self.per_kw.get(target, float("nan"))
        if metric == "per_usd":
            return self.tok_per_usd.get(target, float("nan"))
        if metric == "chain_latency":
            return chain_steps * self.min_e2e_s
        raise KeyError(f"unknown metric {metric!r} (known: objective, {', '.join(GAIN_METRICS)})")


def workload_keys(table: pa.Table) -> np.ndarray:
    """The workload of each row; ``workload (scenario)`` when one table holds several scenarios."""
    w = _col(table, "workload", None).astype(str) if "workload" in table.column_names \
        else np.full(table.num_rows, "workload", dtype=object)
    if "scenario" in table.column_names:
        s = _col(table, "scenario", None).astype(str)
        if len(set(s.tolist())) > 1:
            return np.asarray([f"{a} ({b})" for a, b in zip(w, s)], dtype=object)
    return np.asarray(w, dtype=object)


def design_values(table: pa.Table, objective: str, targets, workloads=None) -> list[DesignSummary]:
    """One :class:`DesignSummary` per (design, workload) of the table (restricted to ``workloads`` if given)."""
    targets = [float(t) for t in targets]
    ids = _col(table, "design_id", None).astype(str)
    wl = workload_keys(table)
    feasible = _col(table, "feasible", None).astype(bool)
    x = _col(table, X)
    y = objective_values(table, objective)
    y_chip = _col(table, "total_tok_s_per_chip")
    y_kw = _col(table, "total_tok_s_per_kw")
    y_usd = objective_values(table, "tok_per_usd") if "usd_per_mtok" in table.column_names \
        else np.full(table.num_rows, np.nan)
    e2e = _col(table, "e2e_s")
    keys = np.asarray([f"{a}\x00{b}" for a, b in zip(ids, wl)], dtype=object)
    if workloads is not None:
        keep = np.isin(wl, np.asarray(list(workloads), dtype=object))
    else:
        keep = np.ones(len(ids), bool)
    order = np.flatnonzero(keep)
    order = order[np.argsort(keys[order], kind="stable")]
    if not len(order):
        return []
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    ends = np.r_[starts[1:], len(k)]
    firsts = [int(order[s]) for s in starts]
    rows = table.take(pa.array(firsts, type=pa.int64())).to_pylist()
    out = []
    for (s, e), row in zip(zip(starts, ends), rows):
        r = order[s:e]
        f = r[feasible[r]]
        fx = x[f]
        idx = pareto_frontier(fx, y[f])
        ox, oy, oe = fx[idx], y[f][idx], e2e[f][idx]
        read = {}
        for name, col in (("per_chip", y_chip), ("per_kw", y_kw), ("per_usd", y_usd)):
            j = pareto_frontier(fx, col[f])
            read[name] = (fx[j], col[f][j])
        finite_x = fx[np.isfinite(fx)]
        finite_e2e = e2e[f][np.isfinite(e2e[f]) & (e2e[f] > 0)]
        out.append(DesignSummary(
            design_id=str(row["design_id"]), name=str(row.get("name", row["design_id"])),
            kind=str(row.get("kind", "candidate")), generation=str(row.get("generation", "")),
            values={t: _interp(ox, oy, t) for t in targets},
            per_chip={t: _interp(*read["per_chip"], t) for t in targets},
            max_interactivity=float(np.max(finite_x)) if len(finite_x) else float("nan"),
            best_objective=float(np.nanmax(oy)) if len(oy) else float("nan"),
            row=row, workload=str(wl[order[s]]),
            per_kw={t: _interp(*read["per_kw"], t) for t in targets},
            tok_per_usd={t: _interp(*read["per_usd"], t) for t in targets},
            e2e_s={t: _interp(ox, oe, t) for t in targets},
            min_e2e_s=float(np.min(finite_e2e)) if len(finite_e2e) else float("nan")))
    return out
