"""The plotted design report, and ``python -m codesign.report sweep=DIR``, which regenerates it from stored results.

:func:`write_report` reads the stored result table and the study's meta (``study.json``: the validated config
snapshot plus what the main job computed), selects the recommended designs itself
(:func:`codesign.recommend.recommend_from_meta`) and writes, atomically:

- ``report.html``: one self-contained page, figures embedded as base64 PNG;
- ``summary.md``: the same in Markdown, linking ``figures/*.png``;
- ``figures/*.png``: the plots (:mod:`codesign.figures`);
- ``study.json``: the meta it was made from.

The output location is checked before any work (:func:`check_report_output`), and the files appear together or not
at all (:func:`codesign.report_output.write_files`: written into a temporary directory, then moved into place).

Nothing here re-runs a sweep. All text that comes from configs or results is HTML-escaped.

The command: ``python -m codesign.report sweep=RUN_DIR [output=DIR] [dpi=N]`` where RUN_DIR holds the
``results.parquet`` and ``study.json`` the ``codesign`` job wrote (``output`` defaults to RUN_DIR itself). Because
``sweep`` is also a config group (``conf/sweep/``), the command line's ``sweep=`` is read into the config key
``sweep_dir`` (``conf/report_cmd.yaml``); ``sweep_dir=RUN_DIR`` works too.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path

import hydra
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from arch_space.errors import ConfigError  # noqa: E402
from codesign.cli import CONF_DIR, entry, fail  # noqa: E402
from codesign.figures import make_figures  # noqa: E402
from codesign.recommend import Recommendation, generation_gains, recommend_from_meta  # noqa: E402
from codesign.report_settings import settings_from_meta  # noqa: E402
from codesign.schema import MAX_DPI  # noqa: E402
from codesign.report_tables import (assumptions, attribution_table, context_line, esc, gains_detail_table,  # noqa: E402
                                    gains_table, headline_table, html_table, md_escape, md_table, parameter_table,
                                    pareto_summary, report_notes, selection_table, sensitivity_table)
from codesign.report_output import check_output, write_files  # noqa: E402

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
    "sensitivity": "Marginal gain of the metric at matched interactivity per +10% of each resource, and per -10% "
                   "of the per-kernel overhead (software: launch and host work): bars from the model's gradients, "
                   "diamonds from finite differences.",
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
PAGES = ("study.json", "summary.md", "report.html")  # written after the figures, the page last


def check_report_output(out_dir, field: str = "output") -> Path:
    """Fail early (one ConfigError line) when the report cannot be written under ``out_dir``: an existing file in
    the directory's place, a directory where report.html, summary.md, study.json or a figure goes, a file in the
    place of figures/, no write permission."""
    return check_output(out_dir, [f"figures/{name}.png" for name in CAPTIONS] + list(PAGES), dirs=("figures",),
                        field=field)


# ---------------------------------------------------------------------------------------------------- the report
def _png(fig, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def write_report(out_dir: Path, table: pa.Table, meta: dict, *legacy, dpi: int = 110,
                 rec: Recommendation | None = None) -> dict[str, Path]:
    """Select the recommended designs from ``table`` with the settings in ``meta`` (or use ``rec``), render every
    figure and write report.html, summary.md, figures/*.png and study.json under ``out_dir``: all of them or, on a
    failure, none (the output location is checked before anything is computed).

    The former call ``write_report(out_dir, table, rec, summaries, meta, dpi=...)`` is still accepted."""
    if isinstance(meta, Recommendation):  # legacy positional form
        rec, meta = meta, legacy[-1]
    out_dir = check_report_output(out_dir)
    rec = recommend_from_meta(table, meta) if rec is None else rec
    gains = generation_gains(rec)
    figs, figure_notes = make_figures(table, rec, meta, gains)
    files: dict[str, bytes] = {}  # relative path -> content, written together at the end
    images = {}
    for name, fig in figs.items():
        files[f"figures/{name}.png"] = data = _png(fig, dpi)
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
    body = [f"<h1>{esc(title)}</h1>", f"<p>{esc(context)}</p>"]
    md = [f"# {md_escape(title)}", "", md_escape(context), ""]
    for level, heading, kind, payload in blocks:
        if kind == "table" and payload not in tables:
            continue
        if heading:
            body.append(f"<h{level}>{esc(heading)}</h{level}>")
            md += ["#" * level + " " + md_escape(heading), ""]
        if kind == "table":
            head, rows = tables[payload]
            body.append(html_table(head, rows))
            md += [md_table(head, rows), ""]
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in payload) + "</ul>")
            md += [f"- {md_escape(n)}" for n in payload] + [""]
        else:
            for name in payload:
                if name not in images:
                    continue
                cap = CAPTIONS.get(name, name)
                body.append(f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{images[name]}"/>'
                            f"<figcaption>{esc(cap)}</figcaption></figure>")
                md += [f"![{md_escape(name)}](figures/{name}.png)", "", f"*{md_escape(cap)}*", ""]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + esc(title) + "</title><style>"
            "body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.35}"
            "table{border-collapse:collapse;font-size:12px;margin:0.6em 0}td,th{border:1px solid #ccc;"
            "padding:3px 6px;text-align:left}th{background:#f3f3f3}img{max-width:100%}"
            "figcaption{font-size:12px;color:#555}</style></head><body>" + "\n".join(body) + "</body></html>")
    files["study.json"] = json.dumps(meta, indent=1, sort_keys=True, default=repr).encode()
    files["summary.md"] = "\n".join(md).encode()
    files["report.html"] = page.encode()
    written = write_files(out_dir, files)
    return {name: written[f"figures/{name}.png"] for name in figs} | {name: written[name] for name in PAGES}


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
    meta = _read_meta(study)
    _check_meta(schema.names, meta, _workloads(_read_parquet(res, lambda p: pq.read_table(p, columns=["workload"]))))


def load_run(sweep_dir) -> tuple[pa.Table, dict]:
    """The stored results and meta of a run directory; ConfigError("sweep", ...) when they are not there."""
    import pyarrow.parquet as pq

    res, study = _run_files(sweep_dir)
    table = _read_parquet(res, pq.read_table)
    _check_columns(table.column_names, res)
    meta = _read_meta(study)
    _check_meta(table.column_names, meta, _workloads(table))
    return table, meta


def _workloads(table: pa.Table) -> list[str]:
    return [w for w in pc.unique(table.column("workload")).to_pylist() if w is not None]


def _check_meta(names, meta: dict, workloads=None) -> None:
    """Every setting of the meta (:func:`settings_from_meta`: one ConfigError line naming the study.json field and
    the value), the objective a column of the results, the mix over workloads that have rows there."""
    s = settings_from_meta(meta, workloads)
    if s["objective"] not in names and s["objective"] not in ("tok_per_usd", "tok_per_joule"):
        raise ConfigError("sweep", f"study.json names objective {s['objective']!r}, not a column of results.parquet")


def _validate(cfg: dict, overridden=()):
    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: sweep, {', '.join(KEYS[1:])})")
    dpi = cfg.get("dpi")
    if dpi is not None and (isinstance(dpi, bool) or not isinstance(dpi, int) or not 0 < dpi <= MAX_DPI):
        raise ConfigError("dpi", f"expected a positive integer <= {MAX_DPI} or null, got {dpi!r}")
    out = cfg.get("output")
    if out is not None and not isinstance(out, str):
        raise ConfigError("output", f"expected a directory path, got {out!r}")
    check_run(cfg.get("sweep_dir"))
    check_report_output(out if out else Path(str(cfg.get("sweep_dir"))).expanduser())
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


__all__ = ["write_report", "regenerate", "load_run", "check_run", "check_report_output", "cli"]
