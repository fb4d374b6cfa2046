"""Selection over stored results: the recommended designs of each generation, ordinary code over the frontiers of
:mod:`codesign.frontier`.

:func:`recommend` selects, per generation and interactivity target, the designs that are Pareto-optimal over the
workloads of a weighted mix (a design that cannot reach the target on a workload is dominated there), ranks them by a
weighted geometric mean of their ratio to the baseline, picks the most robust one (best worst-case ratio across the
mix) and keeps what the comparison with the baseline and the competitors needs (:meth:`Recommendation.gain`,
:func:`generation_gains`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa

from codesign.frontier import GAIN_METRICS, DesignSummary, design_values
from codesign.report_settings import settings_from_meta

COST_NOTE = ("tokens per $ = 1e6 / ($ per M tokens) at the matched point; presets' $ are rental prices "
             "(chip_rental_usd_per_s) while candidates' are owned TCO (capex over its life plus energy), so "
             "per-$ gains of candidates over presets compare an owned cost with a rented one")


def _finite_pos(v) -> bool:
    return v is not None and np.isfinite(v) and v > 0


def weighted_geomean(values: dict[str, float], weights: dict[str, float]) -> float:
    """exp(sum w log v) / sum w over the weighted workloads; NaN if any weighted value is missing or <= 0."""
    tot, acc = 0.0, 0.0
    for w, a in weights.items():
        if a <= 0:
            continue
        v = values.get(w, float("nan"))
        if not _finite_pos(v):
            return float("nan")
        acc += a * math.log(v)
        tot += a
    return math.exp(acc / tot) if tot > 0 else float("nan")


@dataclasses.dataclass
class DesignMix:
    """One design over the workloads of the mix."""
    design_id: str
    name: str
    kind: str
    generation: str
    by_workload: dict[str, DesignSummary]
    row: dict  # design parameters and chip figures
    ratio: dict[float, dict[str, float]] = dataclasses.field(default_factory=dict)  # value / reference per workload
    score: dict[float, float] = dataclasses.field(default_factory=dict)  # weighted geometric mean of ratio
    worst: dict[float, float] = dataclasses.field(default_factory=dict)  # worst-case ratio across the mix
    pareto: dict[float, bool] = dataclasses.field(default_factory=dict)  # Pareto-optimal in its generation
    # over the weighted workloads it reaches (weights renormalised): ranks designs none of which reach the whole mix
    partial: dict[float, float] = dataclasses.field(default_factory=dict)

    @property
    def built(self) -> bool:
        """Has at least one feasible operating point on some workload."""
        return any(np.isfinite(s.max_interactivity) for s in self.by_workload.values())

    def value(self, workload: str, target: float) -> float:
        s = self.by_workload.get(workload)
        return s.values.get(target, float("nan")) if s else float("nan")

    @property
    def values(self) -> dict[float, float]:
        """Legacy (single-workload callers): the objective at each target on the first workload of the design."""
        s = next(iter(self.by_workload.values()), None)
        return dict(s.values) if s else {}

    def reaches(self, target: float, workloads) -> bool:
        return all(np.isfinite(self.value(w, target)) for w in workloads)


@dataclasses.dataclass
class Recommendation:
    objective: str
    targets: tuple
    headline_target: float
    baseline: DesignMix | None
    competitors: list[DesignMix]
    ranked: dict[str, dict[float, list[DesignMix]]]  # generation -> target -> top_k by mix score, best first
    best: dict[str, DesignMix | None]  # generation -> best mix score at the headline target
    infeasible: dict[str, int]  # generation -> designs without any feasible operating point
    unreachable: dict[str, int]  # generation -> built designs missing the headline target on a mix workload
    mix: dict[str, float] = dataclasses.field(default_factory=dict)  # workload -> weight (normalised to sum 1)
    workloads: list[str] = dataclasses.field(default_factory=list)  # every workload of the table
    pareto: dict[str, dict[float, list[DesignMix]]] = dataclasses.field(default_factory=dict)  # full Pareto sets
    robust: dict[str, dict[float, DesignMix | None]] = dataclasses.field(default_factory=dict)
    reference: dict[float, dict[str, tuple[str, float]]] = dataclasses.field(default_factory=dict)
    designs: list[DesignMix] = dataclasses.field(default_factory=list)
    summaries: list[DesignSummary] = dataclasses.field(default_factory=list)
    chain_steps: int = 1
    chain_in_e2e: bool = False  # the rows' E2E already spans the chain (an agentic scenario's does)
    top_k: int = 5
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def generations(self) -> list[str]:
        return list(self.ranked)

    def best_at(self, generation: str, target: float | None = None) -> DesignMix | None:
        t = self.headline_target if target is None else float(target)
        r = self.ranked.get(generation, {}).get(t, [])
        return r[0] if r else None

    def metric(self, design: DesignMix | None, metric: str, target: float, workload: str) -> float:
        if design is None or workload not in design.by_workload:
            return float("nan")
        return design.by_workload[workload].metric(metric, target, 1 if self.chain_in_e2e else self.chain_steps)

    def gain(self, design: DesignMix | None, other: DesignMix | None, target: float | None = None, *,
             workload: str | None = None, metric: str = "objective") -> float:
        """How many times better ``design`` is than ``other`` at ``target`` (> 1: better; for the chain latency the
        speed-up other / design). ``workload=None`` is the mix: the weighted geometric mean of the workloads' gains
        (NaN when either design misses the target on a weighted workload)."""
        t = self.headline_target if target is None else float(target)
        if design is None or other is None:
            return float("nan")
        if workload is None:
            return weighted_geomean({w: self.gain(design, other, t, workload=w, metric=metric) for w in self.mix},
                                    self.mix)
        a, b = self.metric(design, metric, t, workload), self.metric(other, metric, t, workload)
        if not (_finite_pos(a) and _finite_pos(b)):
            return float("nan")
        lower_better = metric in GAIN_METRICS and not GAIN_METRICS[metric][2]
        return b / a if lower_better else a / b

    def featured(self) -> list[DesignMix]:
        """Baseline, each generation's recommended design at the headline target, competitors (no duplicates)."""
        out = [self.baseline] if self.baseline else []
        out += [b for b in self.best.values() if b is not None]
        out += self.competitors
        seen, uniq = set(), []
        for d in out:
            if d.design_id not in seen:
                seen.add(d.design_id)
                uniq.append(d)
        return uniq


CLIFF_MARGIN = 1.5  # a reference whose maximum interactivity is within 1.5x of the target is near its ceiling


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """[n, w] values (higher better, NaN = cannot reach) -> bool [n]: the designs no other design is at least as good
    as on every workload and strictly better on one. Designs that reach the target on no workload are never kept."""
    v = np.where(np.isfinite(values), values, -np.inf)
    n = len(v)
    dominated = np.zeros(n, bool)
    for s in range(0, n, 512):
        d = v[s:s + 512]  # candidates for being dominated
        ge = np.all(v[:, None, :] >= d[None, :, :], axis=2)  # [others, d]
        gt = np.any(v[:, None, :] > d[None, :, :], axis=2)
        dominated[s:s + 512] = np.any(ge & gt, axis=0)
    return ~dominated & np.isfinite(values).any(axis=1) if n else np.zeros(0, bool)


def normalise_mix(mix: dict | None, workloads: list[str]) -> tuple[dict[str, float], list[str]]:
    """Mix weights over the workloads present (sum 1); equal weights when no mix is given. Returns notes too."""
    notes = []
    if not mix:
        return ({w: 1.0 / len(workloads) for w in workloads} if workloads else {}), notes
    present = {}
    for w, a in mix.items():
        if w in workloads:
            present[w] = float(a)
        else:
            notes.append(f"mix workload {w!r} has no rows in the results: left out of the mix")
    tot = sum(a for a in present.values() if a > 0)
    if tot <= 0:
        notes.append("no weighted mix workload in the results: equal weights over the workloads present")
        return {w: 1.0 / len(workloads) for w in workloads}, notes
    return {w: a / tot for w, a in present.items() if a > 0}, notes


def recommend(table: pa.Table, objective: str, targets, top_k: int, *, mix: dict | None = None,
              chain_steps: int = 1, chain_in_e2e: bool = False, headline_target: float | None = None
              ) -> Recommendation:
    """Per generation and target: the mix-Pareto set, ranked by weighted geometric-mean ratio to the baseline."""
    targets = tuple(float(t) for t in targets)
    headline = float(headline_target) if headline_target is not None else targets[len(targets) // 2]
    if headline not in targets:
        targets = tuple(sorted(set(targets) | {headline}))
    summaries = design_values(table, objective, targets)
    present = {s.workload for s in summaries}
    workloads = [w for w in (mix or {}) if w in present] + sorted(present - set(mix or {}))  # the mix's order
    weights, notes = normalise_mix(mix, workloads)
    mixw = list(weights)
    by_id: dict[str, DesignMix] = {}
    for s in summaries:
        d = by_id.get(s.design_id)
        if d is None:
            d = by_id[s.design_id] = DesignMix(s.design_id, s.name, s.kind, s.generation, {}, s.row)
        d.by_workload[s.workload] = s
    designs = sorted(by_id.values(), key=lambda d: d.design_id)
    baseline = next((d for d in designs if d.kind == "baseline"), None)
    competitors = [d for d in designs if d.kind == "competitor"]
    # reference per workload and target: the baseline where it reaches the target, else the best design there
    reference: dict[float, dict[str, tuple[str, float]]] = {}
    for t in targets:
        reference[t] = {}
        for w in workloads:
            b = baseline.value(w, t) if baseline else float("nan")
            if _finite_pos(b):
                reference[t][w] = (baseline.name, b)
                continue
            vals = [(d.value(w, t), d.name) for d in designs if _finite_pos(d.value(w, t))]
            if vals:
                v, name = max(vals)
                reference[t][w] = (f"best design ({name})", v)
                if t == headline:
                    notes.append(f"{w}: the baseline cannot reach {t:g} tok/s/user: ratios at that target are to "
                                 f"the best design there ({name})")
            else:
                reference[t][w] = ("none", float("nan"))
    # a reference close to its own interactivity ceiling sits on the steep tail of its frontier: a ratio there is
    # mostly the distance to that ceiling, so say so where it happens at the headline target
    for d in ([baseline] if baseline else []) + competitors:
        for w in workloads:
            s_w = d.by_workload.get(w)
            top = s_w.max_interactivity if s_w else float("nan")
            if np.isfinite(top) and headline <= top < CLIFF_MARGIN * headline:
                notes.append(f"{d.name} reaches at most {top:.0f} tok/s/user on {w}: at {headline:g} its frontier is "
                             f"steep, so gains over it there are sensitive to the target (compare a lower target)")
    for d in designs:
        for t in targets:
            d.ratio[t] = {w: (d.value(w, t) / reference[t][w][1] if _finite_pos(reference[t][w][1])
                              else float("nan")) for w in workloads}
            d.score[t] = weighted_geomean(d.ratio[t], weights)
            d.partial[t] = weighted_geomean(d.ratio[t], {w: a for w, a in weights.items()
                                                         if _finite_pos(d.ratio[t][w])})
            rs = [d.ratio[t][w] for w in mixw]
            d.worst[t] = float(min(rs)) if rs and all(np.isfinite(rs)) else float("nan")
    gens = sorted({d.generation for d in designs if d.kind == "candidate"})
    ranked, best, infeasible, unreachable, pareto, robust = {}, {}, {}, {}, {}, {}
    # whole-mix score first; where no design reaches the whole mix, the most workloads reached, then the score over
    # those (else the ranking would fall back to design ids and could put a dominated design first)
    fin = lambda v: v if np.isfinite(v) else -np.inf  # noqa: E731
    key_score = lambda t: (lambda d: (-fin(d.score[t]), -sum(np.isfinite(d.value(w, t)) for w in mixw),  # noqa: E731
                                      -fin(d.partial[t]), d.design_id))
    for g in gens:
        cands = [d for d in designs if d.kind == "candidate" and d.generation == g]
        infeasible[g] = sum(1 for d in cands if not d.built)
        unreachable[g] = sum(1 for d in cands if d.built and not d.reaches(headline, mixw))
        ranked[g], pareto[g], robust[g] = {}, {}, {}
        for t in targets:
            mask = pareto_mask(np.asarray([[d.value(w, t) for w in mixw] for d in cands], float).reshape(
                len(cands), len(mixw))) if cands else np.zeros(0, bool)
            for d, m in zip(cands, mask):
                d.pareto[t] = bool(m)
            front = sorted([d for d, m in zip(cands, mask) if m], key=key_score(t))
            pareto[g][t] = front
            ok = [d for d in cands if any(np.isfinite(d.value(w, t)) for w in mixw)]
            ranked[g][t] = sorted(ok, key=key_score(t))[:top_k]
            rob = [d for d in front if np.isfinite(d.worst[t])]
            robust[g][t] = max(rob, key=lambda d: (d.worst[t], d.score[t], d.design_id)) if rob else None
        best[g] = ranked[g][headline][0] if ranked[g][headline] else None
    return Recommendation(objective=objective, targets=targets, headline_target=headline, baseline=baseline,
                          competitors=competitors, ranked=ranked, best=best, infeasible=infeasible,
                          unreachable=unreachable, mix=weights, workloads=workloads, pareto=pareto, robust=robust,
                          reference=reference, designs=designs, summaries=summaries, chain_steps=int(chain_steps),
                          chain_in_e2e=bool(chain_in_e2e), top_k=int(top_k), notes=notes)


def recommend_from_meta(table: pa.Table, meta: dict) -> Recommendation:
    """:func:`recommend` with the settings the study recorded (:func:`settings_from_meta`)."""
    s = settings_from_meta(meta)
    return recommend(table, s["objective"], s["targets"], s["top_k"], mix=s["mix"], chain_steps=s["chain_steps"],
                     chain_in_e2e=s["chain_in_e2e"], headline_target=s["headline_target"])


def generation_gains(rec: Recommendation, metrics=tuple(GAIN_METRICS), *, per_target_best: bool = True) -> list[dict]:
    """Gains of each generation's recommended design over the baseline and every competitor at matched
    interactivity: one row per (generation, target, versus, metric, workload or "mix"). The recommended design is
    the best at each target (``per_target_best``) or the headline one. ``gain`` > 1 means the candidate is better
    (for the chain latency: other's latency / candidate's)."""
    refs = ([rec.baseline] if rec.baseline else []) + list(rec.competitors)
    out = []
    for g in rec.generations:
        for t in rec.targets:
            d = rec.best_at(g, t) if per_target_best else rec.best.get(g)
            if d is None:
                continue
            for o in refs:
                for m in metrics:
                    for w in [*rec.mix, "mix"] if len(rec.mix) > 1 else list(rec.mix):
                        ww = None if w == "mix" else w
                        out.append({
                            "generation": g, "design_id": d.design_id, "design": d.name, "target": t,
                            "versus": o.name, "versus_kind": o.kind, "metric": m, "workload": w,
                            "design_value": rec.metric(d, m, t, w) if ww else float("nan"),
                            "versus_value": rec.metric(o, m, t, w) if ww else float("nan"),
                            "gain": rec.gain(d, o, t, workload=ww, metric=m)})
    return out


def headline_lines(rec: Recommendation, prog: str = "codesign") -> list[str]:
    """What the main job logs: each generation's recommended design and its gains at the headline target."""
    t = rec.headline_target
    mix = ", ".join(f"{w} {a:.2g}" for w, a in rec.mix.items())
    lines = [f"{prog}: selection over the mix ({mix}) at {t:g} tok/s/user, objective {rec.objective}"]
    base = rec.baseline.name if rec.baseline else "baseline"
    for g, d in rec.best.items():
        if d is None:
            lines.append(f"{prog}: {g}: no candidate reaches {t:g} tok/s/user on the mix")
            continue
        def x(g):  # NaN: one of the two cannot reach the target on a workload of the mix
            return f"{g:.2f}x" if np.isfinite(g) else "n/a"

        vs = [f"{x(rec.gain(d, rec.baseline, t))} {base}"] if rec.baseline else []
        vs += [f"{x(rec.gain(d, c, t))} {c.name}" for c in rec.competitors]
        rob = rec.robust.get(g, {}).get(t)
        lines.append(f"{prog}: {g} best at {t:g} tok/s/user: {d.design_id} ({d.name}) {rec.objective}: "
                     + ", ".join(vs) + f"; {len(rec.pareto[g][t])} Pareto-optimal over the mix"
                     + (f"; most robust {rob.design_id} (worst case {rob.worst[t]:.2f}x)" if rob else ""))
    return lines
