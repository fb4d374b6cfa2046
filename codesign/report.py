"""The plotted design report: PNG figures, a self-contained HTML page (figures embedded) and a Markdown summary.

Everything here reads the stored result table and the study's validated config snapshot, never re-runs a sweep.
All text that comes from configs or results is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from codesign.recommend import DesignSummary, Recommendation, columns, pareto_frontier  # noqa: E402
from sweeps.store import atomic_write_bytes, atomic_write_text  # noqa: E402

OBJECTIVE_LABEL = {
    "total_tok_s_per_kw": "total tokens/s per kW of chip rating",
    "total_tok_s_per_chip": "total tokens/s per chip",
    "output_tok_s_per_chip": "output tokens/s per chip",
}
STYLE = {"baseline": dict(color="black", lw=2.2, ls="-"), "competitor": dict(lw=1.3, ls="--"),
         "candidate": dict(lw=2.2, ls="-")}


def _label(d: DesignSummary) -> str:
    if d.kind == "candidate":
        return f"{d.generation} best ({d.design_id[:8]})"
    return f"{d.name} ({d.kind})"


def _frontier(table: pa.Table, design_id: str, metric: str):
    cols = columns(table, ["design_id", "feasible", "interactivity_tok_s_user", metric])
    m = (cols["design_id"] == design_id) & cols["feasible"].astype(bool)
    x, y = cols["interactivity_tok_s_user"][m].astype(float), cols[metric][m].astype(float)
    idx = pareto_frontier(x, y)
    return x[idx], y[idx]


def featured(rec: Recommendation) -> list[DesignSummary]:
    out = [rec.baseline] if rec.baseline else []
    out += [b for b in rec.best.values() if b is not None]
    return out + rec.competitors


def frontier_figure(table: pa.Table, rec: Recommendation, metric: str, ylabel: str, title: str):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for d in featured(rec):
        x, y = _frontier(table, d.design_id, metric)
        if len(x):
            ax.plot(x, y, marker="o", ms=3, label=_label(d), **STYLE[d.kind])
    for t in rec.targets:
        ax.axvline(t, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("interactivity (tok/s/user = 1000 / TPOT ms)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def gains_figure(rec: Recommendation, objective: str):
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ds = featured(rec)
    width = 0.8 / max(len(rec.targets), 1)
    for j, t in enumerate(rec.targets):
        vals = [d.values[t] if np.isfinite(d.values[t]) else 0.0 for d in ds]
        ax.bar(np.arange(len(ds)) + j * width, vals, width, label=f"at {t:g} tok/s/user")
    ax.set_xticks(np.arange(len(ds)) + width * (len(rec.targets) - 1) / 2)
    ax.set_xticklabels([_label(d) for d in ds], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(OBJECTIVE_LABEL[objective])
    ax.set_xlabel("design (0 = cannot reach that interactivity)")
    ax.set_title("Generation comparison at matched interactivity")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def design_space_figure(table: pa.Table, rec: Recommendation, summaries: list[DesignSummary]):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    t = rec.headline_target
    cands = [d for d in summaries if d.kind == "candidate"]
    rng = np.random.default_rng(0)  # deterministic jitter: grid designs share area / power coordinates
    area = np.asarray([d.row["chip_die_area_m2"] * 1e6 for d in cands])
    power = np.asarray([d.row["chip_power_rating_w"] for d in cands])
    jx = area * (1 + 0.03 * rng.standard_normal(len(cands)))
    jy = power * (1 + 0.03 * rng.standard_normal(len(cands)))
    val = np.asarray([d.values[t] for d in cands])
    built = np.asarray([np.isfinite(d.max_interactivity) for d in cands])
    ok = np.isfinite(val)
    sc = ax.scatter(jx[ok], jy[ok], c=val[ok], cmap="viridis", s=22, label="meets target")
    if ok.any():
        fig.colorbar(sc, ax=ax, label=f"{OBJECTIVE_LABEL[rec.objective]} at {t:g} tok/s/user")
    slow = built & ~ok
    ax.scatter(jx[slow], jy[slow], facecolors="none", edgecolors="tab:orange", s=22, label="misses target")
    ax.scatter(jx[~built], jy[~built], marker="x", color="lightgrey", s=18, label="infeasible (package limits)")
    ax.set_xlabel("logic die area (mm^2, jittered)")
    ax.set_ylabel("power rating (W, jittered)")
    ax.set_title("Design space: area vs power")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def make_figures(table: pa.Table, rec: Recommendation, summaries: list[DesignSummary]) -> dict:
    return {
        "frontier_per_chip": frontier_figure(table, rec, "total_tok_s_per_chip", "total tokens/s per chip",
                                             "Throughput per chip vs interactivity"),
        "frontier_per_kw": frontier_figure(table, rec, "total_tok_s_per_kw", "total tokens/s per kW (chip rating)",
                                           "Throughput per kW vs interactivity"),
        "generation_gains": gains_figure(rec, rec.objective),
        "design_space": design_space_figure(table, rec, summaries),
    }


def _png(fig, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def _fmt(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def summary_rows(rec: Recommendation) -> list[list[str]]:
    """Headline table: featured designs, objective at each target and gain over the baseline."""
    rows = []
    for d in featured(rec):
        r = [_label(d)] + [_fmt(d.values[t]) for t in rec.targets]
        r.append(_fmt(rec.gain(d, rec.baseline)) + "x")
        r.append(_fmt(d.max_interactivity))
        rows.append(r)
    return rows


DESIGN_FIELDS = [("design_compute_dies", "dies", 1), ("design_sram_area_fraction", "SRAM area frac", 1),
                 ("design_hbm_stacks", "HBM stacks", 1), ("chip_fp4_flops_per_s", "FP4 PFLOP/s", 1e-15),
                 ("chip_hbm_bandwidth_bytes_per_s", "HBM TB/s", 1e-12), ("chip_hbm_capacity_bytes", "HBM GB", 1e-9),
                 ("chip_sram_capacity_bytes", "SRAM MB", 1e-6), ("chip_power_rating_w", "rating W", 1),
                 ("chip_scaleup_bandwidth_bytes_per_s", "scale-up GB/s/dir", 1e-9),
                 ("chip_die_area_m2", "die mm^2", 1e6), ("chip_cost_usd", "chip cost $", 1)]


def design_table(rec: Recommendation) -> tuple[list[str], list[list[str]]]:
    head = ["generation", "design", f"{rec.objective} @ {rec.headline_target:g}"] + [h for _, h, _ in DESIGN_FIELDS]
    rows = []
    for g, by_t in rec.ranked.items():
        for d in by_t[rec.headline_target]:
            vals = [d.row.get(k) for k, _, _ in DESIGN_FIELDS]
            rows.append([g, d.design_id, _fmt(d.values[rec.headline_target])]
                        + [_fmt(v * s if isinstance(v, (int, float)) and v is not None else v)
                           for v, (_, _, s) in zip(vals, DESIGN_FIELDS)])
    return head, rows


def _html_table(head, rows) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _md_table(head, rows) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def assumptions(meta: dict) -> list[list[str]]:
    """(item, value, kind, source) for the baseline chip and each generation's technology figures."""
    out = []
    for field, prov in meta.get("hardware_provenance", {}).items():
        out.append([f"{meta.get('hardware_name', 'baseline')}.{field}", _fmt(meta["hardware_values"].get(field)),
                    prov["kind"], prov["source"]])
    for g, gen in meta.get("generations", {}).items():
        for field, prov in gen.get("provenance", {}).items():
            out.append([f"{g}.{field}", _fmt(gen.get(field)), prov["kind"], prov["source"]])
    serving = dict(meta.get("serving", {}))
    fit = serving.pop("fit", None)
    fitted = set(fit.get("fitted", [])) if isinstance(fit, dict) else set()
    for k, v in serving.items():
        if k in fitted:
            out.append([f"serving.{k}", _fmt(v), "fitted",
                        f"conf/serving/calibrated.yaml: fitted to {fit.get('data')} ({fit.get('rows')} rows, median "
                        f"|error| {fit.get('median_abs_error_pct')}%, p90 {fit.get('p90_abs_error_pct')}%)"])
        else:
            out.append([f"serving.{k}", _fmt(v), "assumed", "conf/serving (serving-model parameter, not fitted)"])
    return out


def write_report(out_dir: Path, table: pa.Table, rec: Recommendation, summaries: list[DesignSummary],
                 meta: dict, dpi: int = 110) -> dict[str, Path]:
    out_dir = Path(out_dir)
    figs = make_figures(table, rec, summaries)
    paths: dict[str, Path] = {}
    images = {}
    for name, fig in figs.items():
        data = _png(fig, dpi)
        p = out_dir / "figures" / f"{name}.png"
        atomic_write_bytes(p, data)
        paths[name] = p
        images[name] = base64.b64encode(data).decode()
    head = ["design"] + [f"@ {t:g} tok/s/user" for t in rec.targets] + ["gain vs baseline @ headline",
                                                                          "max tok/s/user"]
    rows = summary_rows(rec)
    dhead, drows = design_table(rec)
    arows = assumptions(meta)
    title = meta.get("title", "Design study")
    context = (f"workload {meta.get('workload')}, precision {meta.get('precision')}, scenario "
               f"{meta.get('scenario')}; objective: {OBJECTIVE_LABEL[rec.objective]}; headline target "
               f"{rec.headline_target:g} tok/s/user")
    notes = [f"{g}: {rec.infeasible[g]} designs infeasible by package limits, {rec.unreachable[g]} feasible designs "
             f"cannot reach {rec.headline_target:g} tok/s/user" for g in rec.ranked]
    notes.append("Model: " + meta.get("model_note", ""))
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(context)}</p>",
            "<h2>Headline</h2>", _html_table(head, rows),
            "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"]
    for name in figs:
        body.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{images[name]}"/>'
                    f"<figcaption>{html.escape(name)}</figcaption></figure>")
    body += ["<h2>Recommended designs</h2>", _html_table(dhead, drows),
             "<h2>Assumptions and sources</h2>", _html_table(["figure", "value", "kind", "source"], arows)]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto;}table{border-collapse:collapse;"
            "font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px}img{max-width:100%}</style></head><body>"
            + "\n".join(body) + "</body></html>")
    paths["report.html"] = out_dir / "report.html"
    atomic_write_text(paths["report.html"], page)
    md = [f"# {title}", "", context, "", "## Headline", "", _md_table(head, rows), ""]
    md += [f"- {n}" for n in notes] + [""]
    md += [f"![{name}](figures/{name}.png)" for name in figs] + ["", "## Recommended designs", "",
                                                                 _md_table(dhead, drows), "",
                                                                 "## Assumptions and sources", "",
                                                                 _md_table(["figure", "value", "kind", "source"],
                                                                           arows), ""]
    paths["summary.md"] = out_dir / "summary.md"
    atomic_write_text(paths["summary.md"], "\n".join(md))
    paths["study.json"] = out_dir / "study.json"
    atomic_write_text(paths["study.json"], json.dumps(meta, indent=1, sort_keys=True, default=repr))
    return paths
