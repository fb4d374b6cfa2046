"""The report's figures as matplotlib objects (no files here: :mod:`codesign.report` renders and stores them).

Every builder returns one ``Figure`` whose axes all carry an x and a y label with units (colour bars carry their
own label), a title and, where several series share an axis, a legend. Builders never re-run anything: they read
the stored result table, a :class:`codesign.recommend.Recommendation` computed from it, and the optional
sensitivity / attribution / roofline lists of the study's meta (those three in :mod:`codesign.figures_bottleneck`;
shared plot helpers in :mod:`codesign.plotting`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from codesign.figures_bottleneck import attribution_figure, roofline_figure, sensitivity_figure
from codesign.frontier import GAIN_METRICS, OBJECTIVE_LABEL, X, objective_values, pareto_frontier, workload_keys
from codesign.plotting import empty_panel, panel_grid, plain_log, plt
from codesign.recommend import DesignMix, Recommendation, generation_gains

INTERACTIVITY_LABEL = "interactivity (tok/s/user = 1000 / TPOT ms)"
GEN_COLORS = ["tab:blue", "tab:red", "tab:purple", "tab:cyan", "tab:brown"]
COMP_COLORS = ["tab:green", "tab:orange", "tab:olive", "tab:pink", "tab:gray", "goldenrod", "teal", "slateblue"]


def objective_label(objective: str) -> str:
    return OBJECTIVE_LABEL.get(objective, objective)


def label(d: DesignMix, role: str = "recommended") -> str:
    if d.kind == "candidate":
        return f"{d.generation} {role} ({d.design_id[:8]})"
    return f"{d.name} ({'Gen 1 baseline' if d.kind == 'baseline' else d.kind})"


def styles(rec: Recommendation) -> dict[str, dict]:
    """Line style per featured design id: baseline black, each generation a colour, competitors dashed."""
    out = {}
    gens = rec.generations
    if rec.baseline:
        out[rec.baseline.design_id] = dict(color="black", lw=2.4, ls="-", marker="o")
    for i, g in enumerate(gens):
        c = GEN_COLORS[i % len(GEN_COLORS)]
        b = rec.best.get(g)
        if b is not None:
            out[b.design_id] = dict(color=c, lw=2.4, ls="-", marker="o")
        r = rec.robust.get(g, {}).get(rec.headline_target)
        if r is not None and r.design_id not in out:
            out[r.design_id] = dict(color=c, lw=1.6, ls="-.", marker="^")
    for i, c in enumerate(rec.competitors):
        out.setdefault(c.design_id, dict(color=COMP_COLORS[i % len(COMP_COLORS)], lw=1.3, ls="--", marker="s"))
    return out


def plotted(rec: Recommendation) -> list[tuple[DesignMix, str]]:
    """(design, legend label) of the frontier plots: baseline, recommended and robust picks, competitors."""
    out, seen = [], set()

    def add(d, role="recommended"):
        if d is not None and d.design_id not in seen:
            seen.add(d.design_id)
            out.append((d, label(d, role)))

    add(rec.baseline)
    for g in rec.generations:
        add(rec.best.get(g))
        add(rec.robust.get(g, {}).get(rec.headline_target), "most robust")
    for c in rec.competitors:
        add(c)
    return out


def finish_frontier_axes(ax, targets, drawn: int) -> None:
    """A frontier panel's common finish: dotted target lines, log axes with plain ticks and a grid, or a note
    when no curve was drawn."""
    for t in targets:
        ax.axvline(t, color="grey", lw=0.7, ls=":")
    if drawn:
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log(ax)
        ax.grid(True, which="both", alpha=0.25)
    else:
        ax.text(0.5, 0.5, "no feasible operating point", ha="center", va="center", transform=ax.transAxes)


class FrontierData:
    """The columns the frontier plots read, converted once."""

    def __init__(self, table: pa.Table):
        self.ids = table.column("design_id").to_numpy(zero_copy_only=False).astype(str)
        self.wl = workload_keys(table)
        self.ok = table.column("feasible").to_numpy(zero_copy_only=False).astype(bool)
        self.x = table.column(X).to_numpy(zero_copy_only=False).astype(float)
        self.table = table
        self._cols: dict[str, np.ndarray] = {}

    def col(self, metric: str) -> np.ndarray:
        if metric not in self._cols:
            self._cols[metric] = objective_values(self.table, metric)
        return self._cols[metric]

    def frontier(self, design_id: str, workload: str, metric: str):
        m = (self.ids == design_id) & (self.wl == workload) & self.ok
        x, y = self.x[m], self.col(metric)[m]
        idx = pareto_frontier(x, y)
        return x[idx], y[idx]


def frontier_figure(table: pa.Table, rec: Recommendation, metric: str, ylabel: str, title: str,
                    data: FrontierData | None = None):
    """InferenceX-style: ``metric`` against interactivity on log axes, one panel per workload of the table."""
    data = data or FrontierData(table)
    workloads = rec.workloads or ["workload"]
    fig, axes = panel_grid(len(workloads))
    st = styles(rec)
    handles = {}
    for ax, w in zip(axes, workloads):
        drawn = 0
        for d, lab in plotted(rec):
            x, y = data.frontier(d.design_id, w, metric)
            ok = (x > 0) & (y > 0)
            if ok.any():
                (h,) = ax.plot(x[ok], y[ok], ms=3.5, label=lab, **st.get(d.design_id, {}))
                handles.setdefault(lab, h)
                drawn += 1
        finish_frontier_axes(ax, rec.targets, drawn)
        weight = rec.mix.get(w)
        ax.set_title(f"{w}" + (f" (mix weight {weight:.2g})" if weight is not None and len(rec.mix) > 1 else ""),
                     fontsize=10)
        ax.set_xlabel(INTERACTIVITY_LABEL)
        ax.set_ylabel(ylabel)
    fig.suptitle(title + f"\n(dotted lines: targets {', '.join(f'{t:g}' for t in rec.targets)} tok/s/user; "
                         "upper right is better)", fontsize=10)
    ncol = 3
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(ncol, len(handles)),
                   fontsize=8, frameon=False)
    return fig


def gains_figure(rec: Recommendation, gains: list[dict] | None = None, workload: str = "mix"):
    """Gains of each generation's recommended design over the baseline and each competitor at the headline target:
    one panel per comparison metric (per chip, per kW, per $, agent-chain latency)."""
    gains = generation_gains(rec) if gains is None else gains
    t = rec.headline_target
    if len(rec.mix) == 1 and workload == "mix":
        workload = next(iter(rec.mix))
    refs = ([rec.baseline] if rec.baseline else []) + list(rec.competitors)
    gens = rec.generations
    fig, axes = panel_grid(len(GAIN_METRICS), width=5.6, height=3.9, max_cols=2)
    where = "the workload mix (weighted geometric mean)" if workload == "mix" else workload
    legend: dict[str, str] = {}
    for ax, (m, (mlabel, _unit, higher)) in zip(axes, GAIN_METRICS.items()):
        ylabel = ("speed-up over the reference (x, >1 = faster)" if not higher
                  else "gain over the reference (x, >1 = better)")
        if not refs or not gens:
            empty_panel(ax, "no reference or no candidate", "reference design", ylabel)
            ax.set_title(mlabel, fontsize=10)
            continue
        width = 0.8 / max(len(gens), 1)
        top = 1.0
        for j, g in enumerate(gens):
            vals = []
            for o in refs:
                v = next((r["gain"] for r in gains if r["generation"] == g and r["target"] == t and
                          r["versus"] == o.name and r["metric"] == m and r["workload"] == workload), float("nan"))
                vals.append(v)
            pos = np.arange(len(refs)) + j * width
            h = np.asarray([v if np.isfinite(v) else 0.0 for v in vals])
            ax.bar(pos, h, width, color=GEN_COLORS[j % len(GEN_COLORS)], label=f"{g} recommended")
            legend[f"{g} recommended"] = GEN_COLORS[j % len(GEN_COLORS)]
            for p, v in zip(pos, vals):
                ax.text(p, (v if np.isfinite(v) else 0) * 1.01, f"{v:.2f}x" if np.isfinite(v) else "n/a",
                        ha="center", va="bottom", fontsize=7)
            top = max(top, float(np.nanmax(h)) if len(h) else 1.0)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylim(0, top * 1.25)
        ax.set_xticks(np.arange(len(refs)) + width * (len(gens) - 1) / 2)
        ax.set_xticklabels([o.name for o in refs], rotation=25, ha="right", fontsize=8)
        ax.set_xlabel("reference design (Gen 1 baseline and competitors)")
        ax.set_ylabel(ylabel)
        extra = f", chain of {rec.chain_steps} dependent call(s)" if m == "chain_latency" else ""
        extra += " (presets rental, candidates owned TCO)" if m == "per_usd" else ""
        ax.set_title(f"{mlabel}{extra}", fontsize=9)
    fig.suptitle(f"Generation comparison at matched interactivity ({t:g} tok/s/user) on {where}\n"
                 f"(the agent chain at each design's fastest point)", fontsize=11)
    if legend:
        from matplotlib.patches import Patch

        fig.legend([Patch(color=c) for c in legend.values()], list(legend), loc="outside lower center",
                   ncol=len(legend), fontsize=8, frameon=False)
    return fig


def values_figure(rec: Recommendation):
    """The objective of the featured designs at each target, one panel per workload (0 = cannot reach)."""
    workloads = rec.workloads or ["workload"]
    fig, axes = panel_grid(len(workloads), width=5.6, height=4.4)
    ds = plotted(rec)
    width = 0.8 / max(len(rec.targets), 1)
    for ax, w in zip(axes, workloads):
        for j, t in enumerate(rec.targets):
            vals = [d.value(w, t) for d, _ in ds]
            ax.bar(np.arange(len(ds)) + j * width, [v if np.isfinite(v) else 0.0 for v in vals], width,
                   label=f"at {t:g} tok/s/user")
        ax.set_xticks(np.arange(len(ds)) + width * (len(rec.targets) - 1) / 2)
        ax.set_xticklabels([lab for _, lab in ds], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(objective_label(rec.objective))
        ax.set_xlabel("design (no bar = cannot reach that interactivity)")
        ax.set_title(w, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("Objective at matched interactivity", fontsize=11)
    return fig


def design_space_figure(rec: Recommendation):
    """Candidates' logic area against power rating, coloured by the objective (one workload) or the mix score at the
    headline target; designs that miss the target and designs with no feasible point shown apart."""
    fig, ax = plt.subplots(figsize=(7.8, 5.0), layout="constrained")
    t = rec.headline_target
    cands = [d for d in rec.designs if d.kind == "candidate"]
    single = len(rec.mix) == 1
    w0 = next(iter(rec.mix)) if single else None
    rng = np.random.default_rng(0)  # deterministic jitter: grid designs share area / power coordinates

    def num(d, k):
        v = d.row.get(k)
        return float(v) if isinstance(v, (int, float)) and v is not None else float("nan")

    area = np.asarray([num(d, "chip_die_area_m2") * 1e6 for d in cands])
    power = np.asarray([num(d, "chip_power_rating_w") for d in cands])
    jx = area * (1 + 0.02 * rng.standard_normal(len(cands)))
    jy = power * (1 + 0.02 * rng.standard_normal(len(cands)))
    val = np.asarray([d.value(w0, t) if single else d.score[t] for d in cands], float)
    built = np.asarray([d.built for d in cands], bool)
    ok = np.isfinite(val)
    cbar_label = (f"{objective_label(rec.objective)} at {t:g} tok/s/user" if single
                  else f"mix score at {t:g} tok/s/user (x the reference)")
    if ok.any():
        sc = ax.scatter(jx[ok], jy[ok], c=val[ok], cmap="viridis", s=24, label="meets the target")
        fig.colorbar(sc, ax=ax, label=cbar_label)
    slow = built & ~ok
    if slow.any():
        ax.scatter(jx[slow], jy[slow], facecolors="none", edgecolors="tab:orange", s=24,
                   label="misses the target (on a mix workload)")
    if (~built).any():
        ax.scatter(jx[~built], jy[~built], marker="x", color="lightgrey", s=20,
                   label="infeasible (package limits / no feasible point)")
    for i, g in enumerate(rec.generations):
        b = rec.best.get(g)
        if b is not None:
            ax.scatter([num(b, "chip_die_area_m2") * 1e6], [num(b, "chip_power_rating_w")], marker="*", s=220,
                       facecolors="none", edgecolors=GEN_COLORS[i % len(GEN_COLORS)], linewidths=1.8,
                       label=f"{g} recommended")
    if not cands:
        ax.text(0.5, 0.5, "no candidate designs in the results", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("logic die area (mm^2, jittered)")
    ax.set_ylabel("power rating (W, jittered)")
    ax.set_title("Design space: area vs power")
    if cands:
        ax.legend(fontsize=7, loc="upper left")
    return fig


def make_figures(table: pa.Table, rec: Recommendation, meta: dict | None = None,
                 gains: list[dict] | None = None) -> tuple[dict, list[str]]:
    """Every figure of the report ({name: Figure}) and a note for each optional one skipped for lack of data."""
    meta = meta or {}
    data = FrontierData(table)
    gains = generation_gains(rec) if gains is None else gains
    figs = {
        "frontier_per_chip": frontier_figure(table, rec, "total_tok_s_per_chip", "total tokens/s per chip",
                                             "Throughput per chip vs interactivity", data),
        "frontier_per_kw": frontier_figure(table, rec, "total_tok_s_per_kw", "total tokens/s per kW (chip rating)",
                                           "Throughput per kW vs interactivity", data),
        "generation_gains": gains_figure(rec, gains),
        "objective_at_targets": values_figure(rec),
    }
    notes = []
    for key, name, builder in (("sensitivity", "sensitivity", sensitivity_figure),
                               ("roofline", "roofline", roofline_figure),
                               ("attribution", "attribution", attribution_figure)):
        entries = meta.get(key)
        if entries:
            figs[name] = builder(entries)
        else:
            notes.append(f"{name}: not computed for this run (no {key!r} results in the study's meta), figure "
                         f"skipped")
    figs["design_space"] = design_space_figure(rec)
    return figs, notes
