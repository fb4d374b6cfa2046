"""The design report's tables and text, as (header, rows) of display strings: headline, gains at matched
interactivity, selection over the mix, every parameter of the recommended designs, sensitivity, time attribution,
assumptions with their sources; and the HTML / Markdown renderings of a table (:mod:`codesign.report` lays them out
with the figures). Units are converted here, for display only (``display_unit``)."""

from __future__ import annotations

import html

import numpy as np

from codesign.figures import objective_label, plotted
from codesign.frontier import GAIN_METRICS, design_axes
from codesign.recommend import COST_NOTE, DesignMix, Recommendation


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


def esc(s) -> str:
    return html.escape(str(s), quote=True)


def html_table(head, rows, cls: str = "") -> str:
    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    c = f' class="{esc(cls)}"' if cls else ""
    return f"<table{c}><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def md_escape(s) -> str:
    """Markdown cell / text: pipes escaped, no raw HTML (angle brackets as entities), one line."""
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace(
        "\n", " ")


def md_table(head, rows) -> str:
    lines = ["| " + " | ".join(md_escape(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in rows]
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
                rows.append([g, _fmt(t), str(i), f"{d.name} ({d.design_id})", _mix_score(rec, d, t), _x(d.worst[t]),
                             "yes" if d.pareto.get(t) else "no", "yes" if rob is d else ""]
                            + [_fmt(d.value(w, t)) for w in rec.mix])
            if not rec.ranked[g][t]:
                rows.append([g, _fmt(t), "-", "no candidate reaches this target", "", "", "", ""]
                            + [""] * len(rec.mix))
    return head, rows


def _mix_score(rec: Recommendation, d, t: float) -> str:
    """The whole-mix score; for a design missing the target on part of the mix, the score over what it reaches."""
    if np.isfinite(d.score[t]):
        return _x(d.score[t])
    n = sum(np.isfinite(d.value(w, t)) for w in rec.mix)
    return f"n/a ({_x(d.partial[t])} on {n} of {len(rec.mix)})" if n else "n/a"


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
    # a calibrated file's per-vendor-family sets and the choice of set for chips without one (perf.ParamSet) are
    # not parameters of the shared set: rows of their own below, not a dict dumped into one cell
    families = serving.pop("families", None)
    families = families if isinstance(families, dict) else {}
    has_choice = "unmeasured_family" in serving
    unmeasured = serving.pop("unmeasured_family", None)
    fitted = set(fit.get("fitted", [])) if isinstance(fit, dict) else set()
    fitted_on = (f"fitted to {fit.get('data')} ({fit.get('rows')} rows, median |error| "
                 f"{fit.get('median_abs_error_pct')}%, p90 {fit.get('p90_abs_error_pct')}%)") if fitted else ""
    for k, v in serving.items():
        if k in fitted:
            out.append([f"serving.{k}", _fmt(v), "fitted", f"the run's conf/serving calibration: {fitted_on}"])
        else:
            why = (meta.get("serving_sources") or {}).get(k)
            out.append([f"serving.{k}", _fmt(v), "assumed",
                        f"conf/serving/default.yaml: {why}" if why else "conf/serving (serving-model parameter, "
                                                                        "not fitted)"])
    if has_choice or families:
        out.append(["serving.unmeasured_family", unmeasured or "null", "assumed",
                    "chips of vendors without a fitted set (candidates, Gen 1, other unmeasured vendors) use "
                    + (f"the {unmeasured} family's fitted set" if unmeasured else "the shared set (the serving.* "
                                                                                   "rows above)")
                    + ": how mature their software will be is an assumption (docs/fidelity.md)"])
    for fam, values in sorted(families.items()):
        for k, v in (values or {}).items():
            out.append([f"serving.families.{fam}.{k}", _fmt(v), "fitted" if k in fitted else "assumed",
                        f"the run's conf/serving calibration, {fam} chips' set: {fitted_on}" if k in fitted
                        else f"the run's conf/serving calibration, {fam} chips' set"])
    return out


def context_line(rec: Recommendation, meta: dict) -> str:
    mix = ", ".join(f"{w} ({a:.0%})" for w, a in rec.mix.items())
    return (f"workload mix {mix}; precision {meta.get('precision', 'n/a')}, scenario {meta.get('scenario', 'n/a')}; "
            f"objective: {objective_label(rec.objective)}; interactivity targets "
            f"{', '.join(f'{t:g}' for t in rec.targets)} tok/s/user (headline {rec.headline_target:g}); agent chain "
            f"of {rec.chain_steps} dependent call(s)")


OVERHEAD_BOUND_SHARE = 0.5  # a decode step at least half fixed overhead is set by it, not by the hardware


def overhead_note(meta: dict, target: float) -> str | None:
    """A note when fixed overheads (per-kernel launch and per-step host work) make up at least half of a featured
    design's decode step at the headline target: those figures rest on ``serving.kernel_overhead_s`` and
    ``step_overhead_s``, fitted on GPU software and assumed for chips without measurements (measured 2026-12-06 on
    the default study: at 2.5 us instead of 7.95 us per kernel the picks held, but the featured designs' DeepSeek-R1
    / Kimi K2.5 scores at 100 tok/s/user rose 2.7-3.5x and Gen 3 / GB300, whose overheads stay fitted, 2.5x)."""
    shares: dict[str, list[tuple[float, str]]] = {}
    for e in meta.get("attribution") or []:
        total, over = e.get("total_s"), e.get("overhead_s")
        if e.get("phase") == "decode" and isinstance(total, (int, float)) and isinstance(over, (int, float)) \
                and total > 0 and over / total >= OVERHEAD_BOUND_SHARE:
            shares.setdefault(str(e.get("workload", "")), []).append((over / total, str(e.get("name", ""))))
    if not shares:
        return None
    parts = []
    for w, v in shares.items():
        lo, hi = min(x for x, _ in v), max(x for x, _ in v)
        span = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}-{hi:.0%}"
        parts.append(f"{w} {span} ({', '.join(n for _, n in v)})")
    # candidates take the shared set unless serving.unmeasured_family gives them a fitted family's (perf.ParamSet)
    fam = (meta.get("serving") or {}).get("unmeasured_family")
    knob = (f"serving.families.{fam}.kernel_overhead_s=... (candidates run the {fam} set here, so that moves the "
            f"{fam} chips too)") if fam else "serving.kernel_overhead_s=..."
    return (f"Fixed overheads are at least half of the decode step at {target:g} tok/s/user on " + "; ".join(parts)
            + ": per-kernel launch and per-step host work (serving.kernel_overhead_s, serving.step_overhead_s) are "
              "fitted on GPU software and assumed for chips without measurements, so absolute figures and ratios "
              f"against competitors there rest on them more than on the hardware; rerun with {knob} to see how far "
              "(docs/fidelity.md).")


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
    chain = (f"the scenario's chain of {rec.chain_steps} dependent turns (its E2E, tool gaps included)"
             if rec.chain_in_e2e else f"{rec.chain_steps} x the E2E latency of one request")
    notes.append(f"Agent-chain latency: {chain} at the design's lowest-latency operating point, whatever the target "
                 f"(at matched interactivity TPOT is equal by construction); gains are the reference's latency over "
                 f"the design's.")
    notes += rec.notes + figure_notes
    over = overhead_note(meta, t)
    if over:
        notes.append(over)
    if meta.get("model_note"):
        notes.append("Model: " + str(meta["model_note"]))
    return notes
