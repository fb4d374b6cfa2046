"""The report's bottleneck figures, drawn from the study meta's lists: the sensitivity tornado (gradients with
finite-difference checks), the roofline of the main kernels and the time attribution per phase."""

from __future__ import annotations

import numpy as np

from codesign.plotting import empty_panel, num, panel_grid

ATTRIBUTION_PARTS = [("compute_s", "compute", "tab:blue"), ("memory_s", "memory (HBM / SRAM)", "tab:orange"),
                     ("network_s", "network (collectives)", "tab:green"), ("overhead_s", "fixed overheads", "tab:gray"),
                     ("power_s", "power cap (throttling)", "tab:red")]


def sensitivity_figure(entries: list[dict], max_panels: int = 9):
    """Tornado per (design, workload): % gain of the metric at matched interactivity per +10% of each resource
    (-10% of a software overhead: its label says so), from the model's gradients (bars) with the finite-difference
    check (black diamonds). Entries come per workload, then per design: three columns put the baseline and the two
    generations' picks side by side for each workload of a 3-model mix."""
    entries = list(entries)[:max_panels]
    fig, axes = panel_grid(max(len(entries), 1), width=5.8, height=max(3.0, 0.42 * max(
        (len(e.get("resources", [])) for e in entries), default=4) + 1.4), max_cols=3)
    if not entries:
        empty_panel(axes[0], "no sensitivity results", "gain per +10% of the resource (%)", "resource")
        return fig
    for ax, e in zip(axes, entries):
        res = sorted(e.get("resources", []), key=lambda r: abs(num(r.get("gain_pct_gradient"))))
        labels = [str(r.get("label") or r.get("resource")) for r in res]
        grad = np.asarray([num(r.get("gain_pct_gradient")) for r in res])
        fd = np.asarray([num(r.get("gain_pct_fd")) for r in res])
        pos = np.arange(len(res))
        colors = ["tab:blue" if (g if np.isfinite(g) else 0) >= 0 else "tab:red" for g in grad]
        ax.barh(pos, np.where(np.isfinite(grad), grad, 0.0), color=colors, label="gradient")
        okf = np.isfinite(fd)
        if okf.any():
            ax.scatter(fd[okf], pos[okf], marker="D", color="black", s=18, zorder=3, label="finite difference")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(pos)
        ax.set_yticklabels(labels, fontsize=8)
        metric = e.get("metric", "metric")
        ax.set_xlabel(f"gain in {metric} (%)")
        ax.set_ylabel("resource")
        tgt = e.get("target_tok_s_user")
        ax.set_title(f"{e.get('name', e.get('design_id', '?'))} on {e.get('workload', '?')}"
                     + (f" at {num(tgt):g} tok/s/user" if tgt is not None else ""), fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Sensitivity: where the next unit of a resource pays off (+10% each; overheads -10%)",
                 fontsize=11)
    return fig


def roofline_figure(entries: list[dict], max_panels: int = 4, annotate: int = 6):
    """Roofline per (design, workload): the main kernels' attained FLOP/s against arithmetic intensity, under the
    compute roof and the HBM and SRAM bandwidth roofs (Williams et al., CACM 2009)."""
    entries = list(entries)[:max_panels]
    fig, axes = panel_grid(max(len(entries), 1), width=6.0, height=4.6, max_cols=2)
    xl, yl = "arithmetic intensity (FLOP/byte)", "attained FLOP/s"
    if not entries:
        empty_panel(axes[0], "no roofline results", xl, yl)
        return fig
    for ax, e in zip(axes, entries):
        pts = e.get("points", [])
        xi = np.asarray([num(p.get("intensity_flop_per_byte")) for p in pts])
        ya = np.asarray([num(p.get("achieved_flops_per_s")) for p in pts])
        ok = np.isfinite(xi) & np.isfinite(ya) & (xi > 0) & (ya > 0)
        peak = num(e.get("peak_flops_per_s"))
        hbm = num(e.get("hbm_bandwidth_bytes_per_s"))
        sram = num(e.get("sram_bandwidth_bytes_per_s"))
        lo = min(float(np.min(xi[ok])) if ok.any() else 1.0, 0.5) / 2
        hi = max(float(np.max(xi[ok])) if ok.any() else 1e3, (peak / hbm) if peak > 0 and hbm > 0 else 1e3) * 4
        grid = np.geomspace(lo, hi, 200)
        if peak > 0 and hbm > 0:
            ax.plot(grid, np.minimum(peak, hbm * grid), color="black", lw=1.6,
                    label=f"HBM roof ({hbm / 1e12:.3g} TB/s, peak {peak / 1e15:.3g} PF/s)")
        if peak > 0 and sram > 0:
            ax.plot(grid, np.minimum(peak, sram * grid), color="grey", lw=1.2, ls="--",
                    label=f"SRAM roof ({sram / 1e12:.3g} TB/s)")
        for phase, marker, color in (("prefill", "o", "tab:blue"), ("decode", "s", "tab:red")):
            m = ok & np.asarray([p.get("phase") == phase for p in pts], bool)
            if m.any():
                ax.scatter(xi[m], ya[m], marker=marker, color=color, s=26, zorder=3, label=f"{phase} kernels")
        other = ok & np.asarray([p.get("phase") not in ("prefill", "decode") for p in pts], bool)
        if other.any():
            ax.scatter(xi[other], ya[other], marker="^", color="tab:green", s=26, zorder=3, label="other kernels")
        times = np.asarray([num(p.get("time_s")) for p in pts])
        order = [i for i in np.argsort(-np.where(np.isfinite(times), times, -1)) if ok[i]][:annotate]
        for i in order:
            ax.annotate(str(pts[i].get("kernel", ""))[:28], (xi[i], ya[i]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        if ok.any() or peak > 0:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.25)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(f"{e.get('name', e.get('design_id', '?'))} on {e.get('workload', '?')}", fontsize=9)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle("Roofline of the main kernels", fontsize=11)
    return fig


def attribution_figure(entries: list[dict]):
    """Each phase's step time split into compute, memory, network, fixed overheads and power throttling: stacked
    bars per (design, workload), one panel per phase."""
    entries = list(entries)
    phases = [p for p in ("prefill", "decode") if any(e.get("phase") == p for e in entries)]
    phases += sorted({str(e.get("phase")) for e in entries} - set(phases) - {"None"})
    fig, axes = panel_grid(max(len(phases), 1), width=6.4, height=4.6, max_cols=2)
    if not phases:
        empty_panel(axes[0], "no attribution results", "design and workload", "time per step (ms)")
        return fig
    for ax, ph in zip(axes, phases):
        es = [e for e in entries if e.get("phase") == ph]
        labels = [f"{e.get('name', e.get('design_id', '?'))} on {e.get('workload', '')}" for e in es]
        bottom = np.zeros(len(es))
        pos = np.arange(len(es))
        for key, lab, color in ATTRIBUTION_PARTS:
            v = np.asarray([num(e.get(key)) for e in es]) * 1e3
            v = np.where(np.isfinite(v) & (v > 0), v, 0.0)
            if v.any():
                ax.bar(pos, v, 0.6, bottom=bottom, color=color, label=lab)
                bottom += v
        for p, e, b in zip(pos, es, bottom):
            tot = num(e.get("total_s")) * 1e3
            ax.text(p, b * 1.01, f"{tot:.3g} ms" if np.isfinite(tot) else "", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(pos)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_xlabel("design and workload")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"{ph}: where the step time goes", fontsize=10)
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=len(handles), fontsize=8,
                   frameon=False)
    fig.suptitle("Time attribution by phase", fontsize=11)
    return fig
