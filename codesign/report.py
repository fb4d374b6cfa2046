"""The plotted design report, and ``python -m codesign.report sweep=DIR``, which regenerates it from stored results.

:func:`write_report` reads the stored result table and the study's meta (``study.json``: the validated config
snapshot plus what the main job computed), selects the recommended designs itself
(:func:`codesign.recommend.recommend_from_meta`) and writes, atomically:

- ``report.html``: one self-contained page, figures embedded as base64 PNG;
- ``summary.md``: the same in Markdown, linking ``figures/*.png``;
- ``figures/*.png``: the plots (:mod:`codesign.figures`);
- ``study.json``: the meta it was made from.

Nothing here re-runs a sweep. All text that comes from configs or results is HTML-escaped.

The command: ``python -m codesign.report sweep=RUN_DIR [output=DIR] [dpi=N]`` where RUN_DIR holds the
``results.parquet`` and ``study.json`` the ``codesign`` job wrote (``output`` defaults to RUN_DIR itself). Because
``sweep`` is also a config group (``conf/sweep/``), the command line's ``sweep=`` is read into the config key
``sweep_dir`` (``conf/report_cmd.yaml``); ``sweep_dir=RUN_DIR`` works too.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from pathlib import Path

import hydra
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from arch_space.errors import ConfigError  # noqa: E402
from codesign.cli import CONF_DIR, entry, fail  # noqa: E402
from codesign.figures import make_figures, objective_label, plotted  # noqa: E402
from codesign.recommend import (COST_NOTE, GAIN_METRICS, DesignMix, Recommendation, design_axes,  # noqa: E402
                                generation_gains, recommend_from_meta, settings_from_meta)
from sweeps.store import atomic_write_bytes, atomic_write_text  # noqa: E402

PROG = "codesign.report"
KEYS = ("sweep_dir", "output", "dpi")
REQUIRED_COLUMNS = ("design_id", "kind", "generation", "workload", "feasible", "interactivity_tok_s_user",
                    "total_tok_s_per_chip", "total_tok_s_per_kw")
CAPTIONS = {
    "frontier_per_chip": "Total tokens/s per chip against interactivity over every mapping and concurrency "
                         "(InferenceX's view; upper right is better), per workload.",
    "frontier_per_kw": "Total tokens/s per kW of chip rating against interactivity, per workload.",
    "generation_gains": "Gains of each generation's recommended design over the Gen 1 baseline and the competitors "
                        "at the headline interactivity (n/a: one of the two cannot reach it).",
    "objective_at_targets": "The objective of the featured designs at each interactivity target.",
    "sensitivity": "Marginal gain of the metric at matched interactivity per +10% of each resource: bars from the "
                   "model's gradients, diamonds from finite differences.",
    "roofline": "Attained FLOP/s of the main kernels against their arithmetic intensity, under the compute and "
                "bandwidth roofs.",
    "attribution": "Each phase's step time split into compute, memory, network, fixed overheads and power "
                   "throttling.",
    "design_space": "Every candidate's logic area against its power rating, coloured by the objective at the "
                    "headline target; misses and infeasible designs shown apart.",
}
SECTIONS = [("Frontiers", ["frontier_per_chip", "frontier_per_kw"]),
            ("Generation comparison", ["generation_gains", "objective_at_targets"]),
            ("Sensitivity and bottlenecks", ["sensitivity", "roofline", "attribution"]),
            ("Design space", ["design_space"])]


# ---------------------------------------------------------------------------------------------------- formatting
def _fmt(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v == 0:
            return "0"
        if abs(v) >= 1e7 or abs(v) < 1e-3:
            return f"{v:.{digits + 1}g}"
        return f"{v:,.{digits}g}" if abs(v) < 1e3 else f"{v:,.0f}"
    return str(v)


def _x(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) and np.isfinite(v) else "n/a"


def display_unit(column: str) -> tuple[str, str, float]:
    """(label, unit, scale) to show a ``design_*`` / ``chip_*`` column: PF/s, TB/s, GB, W, mm^2, $ ..."""
    base = column
    for p in ("chip_", "design_"):
        if base.startswith(p):
            base = base[len(p):]
            break
    # (suffix, what it is replaced by in the label, unit, scale)
    rules = [("_flops_per_s", " math rate", "PF/s", 1e-15),
             ("_energy_j_per_flop", " energy per FLOP", "pJ/FLOP", 1e12),
             ("_energy_j_per_byte", " energy per byte", "pJ/B", 1e12),
             ("_usd_per_s", " price / owned TCO", "$/h", 3600.0),
             ("_area_m2", " area", "mm^2", 1e6), ("_m2", "", "mm^2", 1e6), ("cost_usd", "cost", "$", 1.0),
             ("_usd", "", "$", 1.0), ("_latency_s", " latency", "us", 1e6), ("_w", "", "W", 1.0),
             ("_fraction", " fraction", "fraction", 1.0), ("_chips", " chips", "chips", 1.0)]
    if base.endswith("_bytes_per_s"):
        lab = base[:-len("_bytes_per_s")].replace("_", " ")
        return lab, ("GB/s/dir" if "scale" in base else "TB/s"), (1e-9 if "scale" in base else 1e-12)
    if base.endswith("_bytes"):
        lab = base[:-len("_bytes")].replace("_", " ")
        return (lab, "MB", 1e-6) if "sram" in base else (lab, "GB", 1e-9)
    for suffix, repl, unit, scale in rules:
        if base.endswith(suffix):
            lab = (base[:-len(suffix)] + repl).replace("_", " ").strip()
            return (("chip " + lab) if lab == "cost" else lab or base), unit, scale
    if base.endswith("_scale"):
        return base.replace("_", " "), "x", 1.0
    return base.replace("_", " "), "", 1.0


def _optional_chip_fields() -> set[str]:
    try:
        from arch_space.chip import NUMERIC_FIELDS

        return {f for f, (required, *_rest) in NUMERIC_FIELDS.items() if not required}
    except Exception:  # pragma: no cover - the chip module always imports in this repo
        return set()


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _html_table(head, rows, cls: str = "") -> str:
    h = "".join(f"<th>{_esc(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    c = f' class="{_esc(cls)}"' if cls else ""
    return f"<table{c}><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _md(s) -> str:
    """Markdown cell / text: pipes escaped, no raw HTML (angle brackets as entities), one line."""
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace(
        "\n", " ")


def _md_table(head, rows) -> str:
    lines = ["| " + " | ".join(_md(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- tables
def headline_table(rec: Recommendation) -> tuple[list[str], list[list[str]]]:
    """Featured designs: objective per workload at the headline target, mix score at each target, gain."""
    t = rec.headline_target
    head = ["design"] + [f"{w} @ {t:g}" for w in rec.workloads] + \
        [f"mix score @ {x:g}" for x in rec.targets] + ["gain vs baseline @ headline (mix)", "max tok/s/user"]
    rows = []
    for d, lab in plotted(rec):
        mx = [s.max_interactivity for w, s in d.by_workload.items() if w in rec.mix]
        rows.append([lab] + [_fmt(d.value(w, t)) for w in rec.workloads] + [_x(d.score[x]) for x in rec.targets]
                    + [_x(rec.gain(d, rec.baseline, t))] + [_fmt(min(mx)) if mx else "n/a"])
    return head, rows


def gains_table(rec: Recommendation, gains: list[dict], workload: str = "mix") -> tuple[list[str], list[list[str]]]:
    """Gains at matched interactivity, one row per (generation, target, reference): per chip, per kW, per $, chain."""
    w = workload if (workload != "mix" or len(rec.mix) > 1) else next(iter(rec.mix), "mix")
    head = ["generation", "design", "target tok/s/user", "versus"] + [
        GAIN_METRICS[m][0] + (f" ({rec.chain_steps} steps)" if m == "chain_latency" else "") for m in GAIN_METRICS]
    index = {(r["generation"], r["target"], r["versus"], r["metric"], r["workload"]): r for r in gains}
    rows, seen = [], set()
    for r in gains:
        key = (r["generation"], r["target"], r["versus"])
        if r["workload"] != w or key in seen:
            continue
        seen.add(key)
        rows.append([r["generation"], r["design"], _fmt(r["target"]), r["versus"]]
                    + [_x(index.get(key + (m, w), {}).get("gain", float("nan"))) for m in GAIN_METRICS])
    return head, rows


def gains_detail_table(rec: Recommendation, gains: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Per workload at the headline target: both designs' values and the gain, for every comparison metric."""
    t = rec.headline_target
    head = ["generation", "versus", "workload", "metric", "unit", "recommended", "reference", "gain"]
    rows = []
    for r in gains:
        if r["target"] != t or r["workload"] == "mix":
            continue
        lab, unit, _ = GAIN_METRICS[r["metric"]]
        rows.append([r["generation"], r["versus"], r["workload"], lab, unit, _fmt(r["design_value"]),
                     _fmt(r["versus_value"]), _x(r["gain"])])
    return head, rows


def selection_table(rec: Recommendation) -> tuple[list[str], list[list[str]]]:
    """Per generation and target: the ranked designs, mix score, worst case, Pareto membership, robust pick."""
    head = ["generation", "target tok/s/user", "rank", "design", "mix score", "worst case", "Pareto over the mix",
            "most robust"] + [f"{rec.objective} on {w}" for w in rec.mix]
    rows = []
    for g in rec.generations:
        for t in rec.targets:
            rob = rec.robust.get(g, {}).get(t)
            for i, d in enumerate(rec.ranked[g][t], 1):
                rows.append([g, _fmt(t), str(i), f"{d.name} ({d.design_id})", _x(d.score[t]), _x(d.worst[t]),
                             "yes" if d.pareto.get(t) else "no", "yes" if rob is d else ""]
                            + [_fmt(d.value(w, t)) for w in rec.mix])
            if not rec.ranked[g][t]:
                rows.append([g, _fmt(t), "-", "no candidate reaches this target", "", "", "", ""]
                            + [""] * len(rec.mix))
    return head, rows


def pareto_summary(rec: Recommendation) -> list[str]:
    out = []
    for g in rec.generations:
        for t in rec.targets:
            front = rec.pareto[g][t]
            ids = ", ".join(d.design_id[:8] for d in front[:12]) + (" ..." if len(front) > 12 else "")
            out.append(f"{g} at {t:g} tok/s/user: {len(front)} design(s) Pareto-optimal over the mix"
                       + (f" ({ids})" if front else ""))
    return out


def parameter_columns(table_names: list[str]) -> list[str]:
    """design_* axes (discovered), then chip_cost_usd, then every chip_* figure, in table order."""
    cols = [f"design_{a}" for a in design_axes(table_names)]
    if "chip_cost_usd" in table_names:
        cols.append("chip_cost_usd")
    return cols + [c for c in table_names if c.startswith("chip_") and c != "chip_cost_usd"]


def recommended_designs(rec: Recommendation) -> list[tuple[str, DesignMix]]:
    """(column header, design) of the parameter table: baseline, each generation's ranking at the headline target
    and its robust pick, competitors last."""
    out, seen = [], set()

    def add(h, d):
        if d is not None and d.design_id not in seen:
            seen.add(d.design_id)
            out.append((h, d))

    add("Gen 1 baseline: " + rec.baseline.name if rec.baseline else "", rec.baseline)
    t = rec.headline_target
    for g in rec.generations:
        for i, d in enumerate(rec.ranked[g][t], 1):
            add(f"{g} #{i}: {d.design_id[:8]}", d)
        rob = rec.robust.get(g, {}).get(t)
        add(f"{g} robust: {rob.design_id[:8]}" if rob else "", rob)
    for c in rec.competitors:
        add(c.name, c)
    return out


def parameter_table(rec: Recommendation, table_names: list[str]) -> tuple[list[str], list[list[str]]]:
    """Every parameter of the recommended designs (one column per design), converted for display."""
    designs = recommended_designs(rec)
    optional = _optional_chip_fields()
    head = ["parameter", "unit"] + [h for h, _ in designs]
    rows = [["design id", ""] + [d.design_id for _, d in designs],
            ["generation", ""] + [d.generation for _, d in designs]]
    if "origin" in table_names:  # grid / sampled / refined (the main job's gradient refinement)
        rows.append(["origin", ""] + [str(d.row.get("origin") or "n/a") for _, d in designs])
    for col in parameter_columns(table_names):
        lab, unit, scale = display_unit(col)
        prefix = "design: " if col.startswith("design_") else ""
        r = [prefix + lab, unit]
        for _, d in designs:
            v = d.row.get(col)
            if not isinstance(v, (int, float)) or v is None or not np.isfinite(v):
                r.append("n/a")
            elif v == 0 and col.startswith("chip_") and col[len("chip_"):] in optional:
                r.append("n/a")  # unknown / not supported (arch_space.chip convention)
            else:
                r.append(_fmt(float(v) * scale, 4))
        rows.append(r)
    return head, rows


def sensitivity_table(entries: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["design", "workload", "metric", "target tok/s/user", "resource", "gain % (gradient)",
            "gain % (finite difference)", "elasticity", "method"]
    rows = []
    for e in entries:
        for r in e.get("resources", []):
            rows.append([e.get("name", e.get("design_id", "")), e.get("workload", ""), e.get("metric", ""),
                         _fmt(e.get("target_tok_s_user")), r.get("label") or r.get("resource", ""),
                         _fmt(r.get("gain_pct_gradient")), _fmt(r.get("gain_pct_fd")), _fmt(r.get("elasticity")),
                         r.get("method", "")])
    return head, rows


def attribution_table(entries: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = ["compute_s", "memory_s", "network_s", "overhead_s", "power_s", "total_s"]
    head = ["design", "workload", "phase"] + [k[:-2] + " (ms)" for k in keys]
    rows = [[e.get("name", e.get("design_id", "")), e.get("workload", ""), e.get("phase", "")]
            + [_fmt(e[k] * 1e3) if isinstance(e.get(k), (int, float)) else "n/a" for k in keys] for e in entries]
    return head, rows


def assumptions(meta: dict) -> list[list[str]]:
    """(item, value, kind, source) for the baseline chip and each generation's technology figures."""
    out = []
    for field, prov in (meta.get("hardware_provenance") or {}).items():
        out.append([f"{meta.get('hardware_name', 'baseline')}.{field}",
                    _fmt((meta.get("hardware_values") or {}).get(field)), prov.get("kind", ""),
                    prov.get("source", "")])
    for g, gen in (meta.get("generations") or {}).items():
        for field, prov in (gen.get("provenance") or {}).items():
            out.append([f"{g}.{field}", _fmt(gen.get(field)), prov.get("kind", ""), prov.get("source", "")])
    serving = dict(meta.get("serving") or {})
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


def context_line(rec: Recommendation, meta: dict) -> str:
    mix = ", ".join(f"{w} ({a:.0%})" for w, a in rec.mix.items())
    return (f"workload mix {mix}; precision {meta.get('precision', 'n/a')}, scenario {meta.get('scenario', 'n/a')}; "
            f"objective: {objective_label(rec.objective)}; interactivity targets "
            f"{', '.join(f'{t:g}' for t in rec.targets)} tok/s/user (headline {rec.headline_target:g}); agent chain "
            f"of {rec.chain_steps} dependent call(s)")


def report_notes(rec: Recommendation, meta: dict, figure_notes: list[str]) -> list[str]:
    t = rec.headline_target
    notes = [f"{g}: {rec.infeasible[g]} design(s) without a feasible operating point (package limits or memory), "
             f"{rec.unreachable[g]} feasible design(s) miss {t:g} tok/s/user on a workload of the mix"
             for g in rec.generations]
    notes.append("Selection: per generation and target, the designs no other design of that generation matches or "
                 "beats on every workload of the mix (a design that cannot reach the target on a workload is "
                 "dominated there), ranked by the weighted geometric mean of their objective over the reference "
                 "(the Gen 1 baseline where it reaches the target); most robust: the best worst-case ratio.")
    notes.append("Cost: " + COST_NOTE + ".")
    notes.append(f"Agent-chain latency: {rec.chain_steps} x the E2E latency of the frontier operating point at the "
                 f"target (interpolated along the frontier); gains are the reference's latency over the design's.")
    notes += rec.notes + figure_notes
    if meta.get("model_note"):
        notes.append("Model: " + str(meta["model_note"]))
    return notes


# ---------------------------------------------------------------------------------------------------- the report
def _png(fig, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def write_report(out_dir: Path, table: pa.Table, meta: dict, *legacy, dpi: int = 110,
                 rec: Recommendation | None = None) -> dict[str, Path]:
    """Select the recommended designs from ``table`` with the settings in ``meta`` (or use ``rec``), render every
    figure and write report.html, summary.md, figures/*.png and study.json under ``out_dir``.

    The former call ``write_report(out_dir, table, rec, summaries, meta, dpi=...)`` is still accepted."""
    if isinstance(meta, Recommendation):  # legacy positional form
        rec, meta = meta, legacy[-1]
    out_dir = Path(out_dir)
    rec = recommend_from_meta(table, meta) if rec is None else rec
    gains = generation_gains(rec)
    figs, figure_notes = make_figures(table, rec, meta, gains)
    paths: dict[str, Path] = {}
    images = {}
    for name, fig in figs.items():
        data = _png(fig, dpi)
        p = out_dir / "figures" / f"{name}.png"
        atomic_write_bytes(p, data)
        paths[name] = p
        images[name] = base64.b64encode(data).decode()
    title = str(meta.get("title") or "Design study")
    context = context_line(rec, meta)
    notes = report_notes(rec, meta, figure_notes)
    tables = {
        "headline": headline_table(rec),
        "gains": gains_table(rec, gains),
        "gains_detail": gains_detail_table(rec, gains),
        "selection": selection_table(rec),
        "parameters": parameter_table(rec, table.column_names),
        "assumptions": (["figure", "value", "kind", "source"], assumptions(meta)),
    }
    if meta.get("sensitivity"):
        tables["sensitivity"] = sensitivity_table(meta["sensitivity"])
    if meta.get("attribution"):
        tables["attribution"] = attribution_table(meta["attribution"])
    t = rec.headline_target
    mixname = "the mix (weighted geometric mean)" if len(rec.mix) > 1 else "the workload"
    blocks = [  # (heading level, heading, kind, payload)
        (2, "Headline", "table", "headline"),
        (0, "", "list", notes),
        (2, "Frontiers", "figures", ["frontier_per_chip", "frontier_per_kw"]),
        (2, "Generation comparison", "figures", ["generation_gains", "objective_at_targets"]),
        (3, f"Gains at matched interactivity on {mixname}", "table", "gains"),
        (3, f"Per workload at {t:g} tok/s/user", "table", "gains_detail"),
        (2, "Selection over the mix", "list", pareto_summary(rec)),
        (0, "", "table", "selection"),
        (2, "Sensitivity and bottlenecks", "figures", ["sensitivity"]),
        (0, "", "table", "sensitivity"),
        (0, "", "figures", ["roofline", "attribution"]),
        (0, "", "table", "attribution"),
        (2, "Design space", "figures", ["design_space"]),
        (2, "Recommended designs: all parameters", "table", "parameters"),
        (2, "Assumptions and sources", "table", "assumptions"),
    ]
    body = [f"<h1>{_esc(title)}</h1>", f"<p>{_esc(context)}</p>"]
    md = [f"# {_md(title)}", "", _md(context), ""]
    for level, heading, kind, payload in blocks:
        if kind == "table" and payload not in tables:
            continue
        if heading:
            body.append(f"<h{level}>{_esc(heading)}</h{level}>")
            md += ["#" * level + " " + _md(heading), ""]
        if kind == "table":
            head, rows = tables[payload]
            body.append(_html_table(head, rows))
            md += [_md_table(head, rows), ""]
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_esc(n)}</li>" for n in payload) + "</ul>")
            md += [f"- {_md(n)}" for n in payload] + [""]
        else:
            for name in payload:
                if name not in images:
                    continue
                cap = CAPTIONS.get(name, name)
                body.append(f'<figure><img alt="{_esc(name)}" src="data:image/png;base64,{images[name]}"/>'
                            f"<figcaption>{_esc(cap)}</figcaption></figure>")
                md += [f"![{_md(name)}](figures/{name}.png)", "", f"*{_md(cap)}*", ""]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + _esc(title) + "</title><style>"
            "body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.35}"
            "table{border-collapse:collapse;font-size:12px;margin:0.6em 0}td,th{border:1px solid #ccc;"
            "padding:3px 6px;text-align:left}th{background:#f3f3f3}img{max-width:100%}"
            "figcaption{font-size:12px;color:#555}</style></head><body>" + "\n".join(body) + "</body></html>")
    paths["report.html"] = out_dir / "report.html"
    atomic_write_text(paths["report.html"], page)
    paths["summary.md"] = out_dir / "summary.md"
    atomic_write_text(paths["summary.md"], "\n".join(md))
    paths["study.json"] = out_dir / "study.json"
    atomic_write_text(paths["study.json"], json.dumps(meta, indent=1, sort_keys=True, default=repr))
    return paths


# ---------------------------------------------------------------------------------------------------- the command
def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _run_files(sweep_dir) -> tuple[Path, Path]:
    if sweep_dir is None or str(sweep_dir).strip() == "":
        raise ConfigError("sweep", "required: the run directory holding results.parquet and study.json "
                                   "(python -m codesign.report sweep=DIR)")
    d = Path(str(sweep_dir)).expanduser()
    if not d.is_dir():
        raise ConfigError("sweep", f"no such directory {str(d)!r}")
    res, study = d / "results.parquet", d / "study.json"
    if not res.is_file():
        raise ConfigError("sweep", f"no results.parquet in {str(d)!r} (expected a run directory written by codesign)")
    if not study.is_file():
        raise ConfigError("sweep", f"no study.json in {str(d)!r} (expected a run directory written by codesign)")
    return res, study


def _read_meta(study: Path) -> dict:
    try:
        meta = json.loads(study.read_text())
    except Exception as exc:
        raise ConfigError("sweep", f"cannot read {str(study)!r} as JSON: {_first_line(exc)}") from None
    if not isinstance(meta, dict):
        raise ConfigError("sweep", f"{str(study)!r} does not hold a JSON object")
    return meta


def _check_columns(names, res: Path) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ConfigError("sweep", f"{str(res)!r} is not a codesign result table (missing columns: "
                                   f"{', '.join(missing)})")


def _read_parquet(path, read):
    """``read(path)`` (pq.read_schema or pq.read_table), any failure as one ConfigError line naming the file."""
    try:
        return read(path)
    except Exception as exc:
        raise ConfigError("sweep", f"cannot read {str(path)!r} as Parquet: {_first_line(exc)}") from None


def check_run(sweep_dir) -> None:
    """Start-up check of a run directory without reading the rows: files present, Parquet schema, JSON meta."""
    import pyarrow.parquet as pq

    res, study = _run_files(sweep_dir)
    schema = _read_parquet(res, pq.read_schema)
    _check_columns(schema.names, res)
    _check_meta(schema.names, _read_meta(study))


def load_run(sweep_dir) -> tuple[pa.Table, dict]:
    """The stored results and meta of a run directory; ConfigError("sweep", ...) when they are not there."""
    import pyarrow.parquet as pq

    res, study = _run_files(sweep_dir)
    table = _read_parquet(res, pq.read_table)
    _check_columns(table.column_names, res)
    meta = _read_meta(study)
    _check_meta(table.column_names, meta)
    return table, meta


def _check_meta(names, meta: dict) -> None:
    s = settings_from_meta(meta)
    if s["objective"] not in names and s["objective"] not in ("tok_per_usd", "tok_per_joule"):
        raise ConfigError("sweep", f"study.json names objective {s['objective']!r}, not a column of results.parquet")
    if not s["targets"] or not all(np.isfinite(t) and t > 0 for t in s["targets"]):
        raise ConfigError("sweep", f"study.json has no valid interactivity targets: {list(s['targets'])}")


def _validate(cfg: dict, overridden=()):
    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: sweep, {', '.join(KEYS[1:])})")
    dpi = cfg.get("dpi")
    if dpi is not None and (isinstance(dpi, bool) or not isinstance(dpi, int) or dpi <= 0):
        raise ConfigError("dpi", f"expected a positive integer or null, got {dpi!r}")
    out = cfg.get("output")
    if out is not None and not isinstance(out, str):
        raise ConfigError("output", f"expected a directory path, got {out!r}")
    check_run(cfg.get("sweep_dir"))
    return cfg


def regenerate(sweep_dir, output=None, dpi: int | None = None) -> dict[str, Path]:
    """Rewrite the report of a stored run (no evaluation): ``output`` defaults to the run directory."""
    table, meta = load_run(sweep_dir)
    dpi = dpi or settings_from_meta(meta)["dpi"]
    return write_report(Path(output) if output else Path(str(sweep_dir)).expanduser(), table, meta, dpi=dpi)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="report_cmd")
def _main(cfg: DictConfig) -> None:
    c = OmegaConf.to_container(cfg, resolve=True)
    try:
        _validate(c, ())
        paths = regenerate(c.get("sweep_dir"), c.get("output"), c.get("dpi"))
    except ConfigError as err:
        fail(PROG, err)
    print(f"{PROG}: report   {paths['report.html']}")
    print(f"{PROG}: summary  {paths['summary.md']}")
    print(f"{PROG}: figures  {paths['frontier_per_chip'].parent}")


def rewrite_argv(argv: list[str]) -> list[str]:
    """``sweep=DIR`` -> ``sweep_dir=DIR``: ``sweep`` is a config group (conf/sweep/), so Hydra would take the value
    for one of its options."""
    out = []
    for a in argv:
        for p in ("sweep=", "+sweep=", "++sweep="):
            if a.startswith(p):
                a = "sweep_dir=" + a[len(p):]
                break
        out.append(a)
    return out


def cli() -> None:
    sys.argv[1:] = rewrite_argv(sys.argv[1:])
    entry(PROG, "report_cmd", _validate, _main)


if __name__ == "__main__":
    cli()


__all__ = ["write_report", "regenerate", "load_run", "check_run", "display_unit", "assumptions", "parameter_table",
           "cli"]
