"""Fan design batches out to Ray tasks that evaluate them with the vectorised serving model and store the rows.

Ray as its documentation advises: many designs per task (``batch_size``, thousands at scale), the shared inputs
(workload kernel table, serving parameters, scenario, mappings, operating points) ``ray.put`` once, and at most ``max_in_flight`` tasks
outstanding, drained with ``ray.wait`` (backpressure). Each task writes its own part file atomically, so an
interrupted sweep keeps every finished batch, and a re-run evaluates only the designs that have no rows yet.
A task whose worker dies is retried by Ray (``max_retries``). Starting Ray and checking that its workers run this
process's code: ``sweeps/ray_workers.py``.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from arch_space.chip import NUMERIC_FIELDS, Chip
from arch_space.design_space import AXES
from serving.mappings import mapping_name
from serving.memory import INFEASIBLE_REASONS
from serving.perf import family_of
from serving.serve import METRICS, evaluate_grid
from sweeps.ray_workers import pin_worker_to_a_core
from sweeps.store import ResultStore, definition_hash


@dataclasses.dataclass
class DesignSet:
    """Designs of one generation (or the preset chips): ids, labels, chips as one batch, design feasibility."""
    generation: str
    design_id: list[str]
    name: list[str]
    kind: list[str]  # baseline | competitor | candidate
    chips: Chip
    feasible: np.ndarray
    reason: list[str]
    params: dict[str, np.ndarray]  # design axes (NaN for presets)
    extra: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    vendor: str = "candidate"  # whose family's serving parameters evaluate these designs (one vendor per set)

    def __len__(self):
        return len(self.design_id)

    def take(self, idx) -> "DesignSet":
        idx = np.asarray(idx, dtype=np.int64)
        chips = Chip(**{f: np.asarray(getattr(self.chips, f))[idx] for f in NUMERIC_FIELDS}, name=self.chips.name)
        return DesignSet(self.generation, [self.design_id[i] for i in idx], [self.name[i] for i in idx],
                         [self.kind[i] for i in idx], chips, self.feasible[idx], [self.reason[i] for i in idx],
                         {k: v[idx] for k, v in self.params.items()}, {k: v[idx] for k, v in self.extra.items()},
                         self.vendor)


@dataclasses.dataclass(frozen=True)
class SharedInputs:
    workload: str
    precision: str
    scenario: str
    kernels: object  # serving.kernel_table.KernelTable of the workload in its precision
    params: object  # serving.perf.ServingParams
    scenario_spec: object  # serving.scenario.Scenario (static under jit)
    mappings: object  # serving.perf.Mapping with [M] leaves
    concurrency: np.ndarray
    keep: str = "all"  # "all" operating points, or each design's "frontier" (see frontier_mask)
    families: tuple = ()  # (vendor family, ServingParams) pairs: a design set of that vendor uses its own set
    pad_to: int = 0  # evaluate batches padded to this many designs: one compiled shape per worker


KEEP = ("all", "frontier")


def frontier_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[N, P] -> bool [N, P]: the points of each design (row) that no other point of that design beats on both
    interactivity ``x`` and throughput ``y`` (NaN = infeasible, never kept; of exact duplicates the first is kept,
    as ``codesign.frontier.pareto_frontier`` does). Per-chip, per-kW (rating) and per-$ throughput differ from
    ``total_tok_s_per_chip`` by a per-design constant, so this one frontier holds every point a selection on those
    objectives can use (the InferenceX frontier). O(P log P) per row: sort by x descending (ties: y descending),
    keep the points whose y beats every point before them (Kung et al. 1975 for two objectives)."""
    ok = np.isfinite(x) & np.isfinite(y)
    xi, yi = np.where(ok, x, -np.inf), np.where(ok, y, -np.inf)
    order = np.lexsort((-yi, -xi), axis=-1)
    ys = np.take_along_axis(yi, order, axis=-1)
    best_before = np.concatenate([np.full((len(x), 1), -np.inf), np.maximum.accumulate(ys, axis=-1)[:, :-1]], 1)
    keep_sorted = ys > best_before
    out = np.zeros(x.shape, bool)
    np.put_along_axis(out, order, keep_sorted, axis=-1)
    return out & ok


def _bucket(n: int, cap: int) -> int:
    """Pad a batch's feasible designs to a power of two (at least 64, at most the batch size): a handful of
    compiled shapes per worker instead of one per batch, and little work spent on padding."""
    return min(max(64, 1 << max(n - 1, 0).bit_length()), max(cap, n))


def _padded(chips: Chip, n: int, pad_to: int) -> Chip:
    if pad_to <= n:
        return chips
    idx = np.r_[np.arange(n), np.full(pad_to - n, n - 1)]
    return Chip(**{f: np.asarray(getattr(chips, f))[idx] for f in NUMERIC_FIELDS}, name=chips.name)


def _evaluate(shared: SharedInputs, params, chips: Chip, n: int, pad: int) -> dict:
    """The n designs' metrics [n, mappings, concurrencies], evaluated padded to ``pad`` (one compiled shape)."""
    out = evaluate_grid(_padded(chips, n, pad), shared.kernels, params, shared.scenario_spec, shared.mappings,
                        shared.concurrency)
    return {k: np.asarray(v)[:n] for k, v in out.items()}


# (workload, precision, scenario, padded batch, mappings, concurrencies): the compiled shapes whose batched evaluation
# this process has checked against a design evaluated alone (_verify_compiled_batch); the parameters are traced
_VERIFIED: set = set()


def _verify_compiled_batch(out: dict, sub: DesignSet, shared: SharedInputs, params, pad: int) -> None:
    """A design's rows must not depend on the batch it is evaluated in. The jit-compiled batched evaluation once
    made them (at commit 4e1bad3 up to 66% of a design's TPOT went missing in a batch of 216 different designs, while
    each design alone, and the batch with jit disabled, gave the right figures; it took ~64 designs x 15 mappings to
    show, whatever the concurrencies; tests/codesign/test_study_batches.py). The cause was XLA:CPU's YNNPACK
    reduce fusions, now off for every serving program (serving/compile.py); this check stays for whatever else a
    compiler may do.
    So the first batch of each compiled shape in a process is evaluated twice more with the same compiled program
    (no compile), and every metric of every design must agree:

    - the batch rolled by half its length, so every design sits at another position among other neighbours. This
      checks every row: at 4e1bad3 which rows went wrong depended on the position (Gen 2's first batch: 10 of 18
      designs spread over it, but not its middle one), and a rolled batch differed in all 72 of Gen 2's designs and
      128 of Gen 3's 144;
    - its middle design as a batch of copies of itself, where no other design can leak in (a leak that a roll
      leaves alone, such as one from a batch-wide reduction).

    Costs two more evaluations per worker and compiled shape (not per batch)."""
    n = len(sub)
    key = (shared.workload, shared.precision, shared.scenario, pad, len(np.atleast_1d(shared.mappings.tp)),
           len(shared.concurrency))
    if n < 2 or key in _VERIFIED:
        return
    # at the batch's own padded shape: the compiled program is reused, not compiled again
    roll = np.roll(np.arange(n), n // 2)  # position p holds design roll[p]: none stays where it was
    rolled = _evaluate(shared, params, sub.take(roll).chips, n, pad)
    i = n // 2
    alone = _evaluate(shared, params, sub.take([i]).chips, 1, pad)
    for how, idx, got in (("at another position of the batch", roll, rolled), ("alone", [i], alone)):
        for k in METRICS:
            a, b = out[k][idx], got[k]
            if not np.allclose(a, b, rtol=1e-4, atol=0.0, equal_nan=True):
                j = np.unravel_index(np.argmax(np.abs(np.nan_to_num(a - b))), a.shape)
                raise RuntimeError(f"sweeps: design {sub.design_id[idx[j[0]]]} ({shared.workload}) gets {k} "
                                   f"{a[j]:.6g} in a batch of {n} designs but {b[j]:.6g} {how}: the compiled batch "
                                   f"evaluation is wrong (as at commit 4e1bad3, docs/fidelity.md); no rows were "
                                   f"stored. Try another sweep.batch_size and report it")
    _VERIFIED.add(key)


def evaluate_rows(shared: SharedInputs, ds: DesignSet) -> pa.Table:
    """Every (design, tp, concurrency) row of one batch; designs infeasible by construction get one row each."""
    ok = np.flatnonzero(ds.feasible)
    bad = np.flatnonzero(~ds.feasible)
    mp = shared.mappings
    m, c = len(np.atleast_1d(mp.tp)), len(shared.concurrency)
    names = [mapping_name(type(mp)(*(np.atleast_1d(getattr(mp, f))[i] for f in ("tp", "dp", "ep", "pp"))))
             for i in range(m)]
    cols: dict[str, list | np.ndarray] = {}
    if len(ok):
        sub = ds.take(ok)
        pad = _bucket(len(ok), shared.pad_to) if shared.pad_to else 0
        params = dict(shared.families).get(family_of(ds.vendor), shared.params)
        out = _evaluate(shared, params, sub.chips, len(ok), pad)
        _verify_compiled_batch(out, sub, shared, params, pad)
        n_rows = len(ok) * m * c
        code = out["infeasible_code"].reshape(n_rows)
        sel = np.arange(n_rows)
        if shared.keep == "frontier":
            x = np.where(code == 0, out["interactivity_tok_s_user"].reshape(n_rows), np.nan).reshape(len(ok), m * c)
            y = out["total_tok_s_per_chip"].reshape(len(ok), m * c)
            keep = frontier_mask(x, y)
            none = ~keep.any(axis=1)
            keep[none, 0] = True  # a design with no feasible point keeps one row: why (its first point's reason)
            sel = np.flatnonzero(keep.reshape(n_rows))
        rep = np.repeat(np.arange(len(ok)), m * c)[sel]
        midx = np.tile(np.repeat(np.arange(m), c), len(ok))[sel]
        cols["mapping"] = [names[i] for i in midx]
        for f in ("tp", "dp", "ep", "pp"):
            cols[f] = np.asarray(np.atleast_1d(getattr(mp, f)), dtype=np.int64)[midx]
        cols["concurrency"] = np.tile(shared.concurrency, len(ok) * m).astype(np.int64)[sel]
        code = code[sel]
        cols["feasible"] = code == 0
        cols["reason"] = [INFEASIBLE_REASONS.get(int(k), "") for k in code]
        for k in METRICS:
            v = out[k].reshape(n_rows)[sel].astype(np.float64)
            cols[k] = v if k in ("hbm_used_bytes", "chips") else np.where(code == 0, v, np.nan)
        base = sub
    else:
        rep = np.zeros(0, dtype=np.int64)
        base = None
    tables = []
    if base is not None:
        tables.append(_table(shared, base, rep, cols))
    if len(bad):
        sub = ds.take(bad)
        n = len(bad)
        bcols = {"mapping": [""] * n} | {f: np.zeros(n, np.int64) for f in ("tp", "dp", "ep", "pp")} | {
            "concurrency": np.zeros(n, np.int64), "feasible": np.zeros(n, bool), "reason": list(sub.reason)} | {
            k: np.full(n, np.nan) for k in METRICS}
        tables.append(_table(shared, sub, np.arange(n), bcols))
    return pa.concat_tables(tables)


def _table(shared: SharedInputs, ds: DesignSet, rep: np.ndarray, cols: dict) -> pa.Table:
    n = len(rep)
    data = {
        "design_id": [ds.design_id[i] for i in rep],
        "name": [ds.name[i] for i in rep],
        "kind": [ds.kind[i] for i in rep],
        "generation": [ds.generation] * n,
        "workload": [shared.workload] * n,
        "precision": [shared.precision] * n,
        "scenario": [shared.scenario] * n,
    }
    data.update(cols)
    for a in AXES:
        data[f"design_{a}"] = ds.params[a][rep] if a in ds.params else np.full(n, np.nan)
    for k, v in ds.extra.items():
        data[k] = v[rep]
    for f in NUMERIC_FIELDS:
        data[f"chip_{f}"] = np.asarray(getattr(ds.chips, f), dtype=np.float64)[rep]
    return pa.table(data)


class Progress:
    """One status line on stderr: done / total designs, rate and ETA."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.t0, self.enabled = total, 0, time.perf_counter(), enabled

    def update(self, n: int):
        self.done += n
        if not self.enabled:
            return
        dt = time.perf_counter() - self.t0
        rate = self.done / dt if dt > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r[{bar:<30}] {self.done}/{self.total} designs  {rate:,.0f}/s  ETA {eta:,.0f} s ")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _done_ids(store: ResultStore, generation: str, workload: str) -> set[str]:
    done: set[str] = set()
    for p in store.parts():
        if f"generation={generation}" in str(p) and f"workload={workload}" in str(p):
            done.update(pq.read_table(p, columns=["design_id"]).column("design_id").unique().to_pylist())
    return done


def _evaluate_and_store(store_root_parent: str, definition: dict, shared: SharedInputs, ds: DesignSet) -> int:
    pin_worker_to_a_core()
    store = ResultStore(store_root_parent, definition)
    key = definition_hash({"ids": ds.design_id}, 20)
    if not store.has(ds.generation, shared.workload, key):
        store.write(ds.generation, shared.workload, key, evaluate_rows(shared, ds))
    return len(ds)


def run_sweep(design_sets: list[DesignSet], shared: SharedInputs, store: ResultStore, *, batch_size: int,
              max_in_flight: int, max_retries: int = 3, progress: bool = True, task=None, on_batch=None) -> dict:
    """Evaluate every design without rows yet; return counts. Ray must already be initialised.

    ``task`` replaces the Ray task body (same signature as ``_evaluate_and_store``; tests inject faults with it) and
    ``on_batch(done_designs)`` is called on the driver after each finished batch."""
    import ray

    store.open()
    shared = dataclasses.replace(shared, pad_to=batch_size)
    batches = []  # (design set, indices): each batch is cut out only when it is submitted (memory: one copy)
    for ds in design_sets:
        done = _done_ids(store, ds.generation, shared.workload)
        order = sorted((i for i, d in enumerate(ds.design_id) if d not in done), key=lambda i: ds.design_id[i])
        for s in range(0, len(order), batch_size):
            batches.append((ds, order[s:s + batch_size]))
    total = sum(len(idx) for _, idx in batches)
    bar = Progress(total, enabled=progress and total > 0)
    remote = ray.remote(max_retries=max_retries, retry_exceptions=False)(task or _evaluate_and_store)
    shared_ref = ray.put(shared)
    parent = str(store.root.parent)
    pending = []

    def drain():
        nonlocal pending
        ready, pending = ray.wait(pending, num_returns=1)
        n = sum(ray.get(ready))
        bar.update(n)
        if on_batch is not None:
            on_batch(bar.done)

    for ds, idx in batches:
        if len(pending) >= max_in_flight:
            drain()
        pending.append(remote.remote(parent, store.definition, shared_ref, ds.take(idx)))
    while pending:
        drain()
    return {"evaluated_designs": total, "batches": len(batches), "sweep_id": store.sweep_id}


def result_design_ids(table: pa.Table) -> np.ndarray:
    return np.asarray(pc.unique(table.column("design_id")).to_pylist())
