"""``python -m codesign.compare designs=[gb200,jalapeno_gen1] workloads=[gpt_oss_120b] scenario=... precision=...``

Puts chips side by side on the same workloads: each entry of ``designs`` is a hardware preset (``conf/hardware``)
or, with ``sweep=RUN_DIR``, a design id (or name, or unique id prefix) of that run's ``results.parquet``, whose Chip
is rebuilt from the row's ``chip_*`` columns. Every design is evaluated with the serving model over every parallel
mapping up to ``scenario.max_chips`` and every concurrency of the scenario (``sweeps.runner.evaluate_rows``, no
Ray), and the command prints, per workload, each design's frontier read at the interactivity ``targets``: tokens/s
per chip, per kW of rating and $ per million tokens (presets: rental price; sweep designs: owned TCO). It writes
the throughput-versus-interactivity frontier plot ``frontier.png`` and the evaluated rows ``results.parquet``
under ``output`` (default ``compare/`` in the working directory) and prints where. ``format=json`` prints one JSON
object instead of the tables. As for ``codesign.report``, ``sweep=`` is read into the config key ``sweep_dir``.

The output location is checked before any modelling, and the two files appear together or not at all
(:func:`codesign.report_output.write_files`). A sweep design's chip is rebuilt through the chip's own checks
(:meth:`arch_space.chip.Chip.from_dict`), so a corrupt ``chip_*`` figure is one error line naming the design and
the column.
"""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from codesign.cli import CONF_DIR, entry, fail, overridden_keys
from codesign.report_output import check_output, write_files

PROG = "codesign.compare"
OUTPUT_FILES = ("frontier.png", "results.parquet")
KEYS = ("designs", "workloads", "precision", "scenario", "serving", "sweep_dir", "targets", "output", "format")


def _names(conf_group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / conf_group).glob("*.yaml"))


def _as_list(v, path: str) -> list:
    if isinstance(v, str):
        return [v]
    if not isinstance(v, (list, tuple)) or not v:
        raise ConfigError(path, f"expected a non-empty list, got {v!r}")
    return list(v)


class SweepDesigns:
    """The designs of a stored run (one row each), looked up by id, name or unique id prefix."""

    def __init__(self, run_dir):
        import pyarrow.parquet as pq

        from arch_space.chip import NUMERIC_FIELDS

        d = Path(str(run_dir)).expanduser()
        res = d / "results.parquet" if d.is_dir() else d
        if not res.is_file():
            raise ConfigError("sweep", f"no results.parquet in {str(d)!r} (expected a run directory written by "
                                       f"codesign)")
        try:
            schema = pq.read_schema(res)
            want = ["design_id", "name", "kind", "generation", "feasible", "reason", "mapping", "chip_cost_usd"] + [
                f"chip_{f}" for f in NUMERIC_FIELDS]
            missing = [c for c in ("design_id", *[f"chip_{f}" for f in NUMERIC_FIELDS]) if c not in schema.names]
            if missing:
                raise ConfigError("sweep", f"{str(res)!r} lacks columns {', '.join(missing)}")
            table = pq.read_table(res, columns=[c for c in want if c in schema.names])
        except ConfigError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError("sweep", f"cannot read {str(res)!r} as Parquet: {first}") from None
        self.path = res
        self.rows: dict[str, dict] = {}
        self.feasible: dict[str, bool] = {}
        for r in table.to_pylist():
            i = str(r["design_id"])
            self.rows.setdefault(i, r)
            self.feasible[i] = self.feasible.get(i, False) or bool(r.get("feasible", True))
            if not r.get("feasible", True) and r.get("mapping", "x") == "" and r.get("reason"):
                self.rows[i] = self.rows[i] | {"_design_reason": r["reason"]}

    def find(self, key: str) -> str | None:
        if key in self.rows:
            return key
        by_name = [i for i, r in self.rows.items() if r.get("name") == key]
        if len(by_name) == 1:
            return by_name[0]
        pre = [i for i in self.rows if len(key) >= 6 and i.startswith(key)]
        return pre[0] if len(pre) == 1 else None


def _sweep_chip(row: dict, source="results.parquet"):
    """The Chip of a stored design, from its row's ``chip_*`` columns, checked as a preset is
    (:meth:`Chip.from_dict`: required figures finite and > 0, optional ones unknown when stored as 0, idle power
    below the rating...). A design infeasible by construction (no row of it has a mapping) may have zero figures
    (no usable area, so no math or SRAM): its figures need only be finite and >= 0. A bad figure is
    ConfigError("sweep", "design ID in SOURCE: chip_FIELD: ...")."""
    from arch_space.chip import NUMERIC_FIELDS, Chip
    from arch_space.validation import check_quantity

    did, name = str(row["design_id"]), str(row.get("name") or row["design_id"])
    where = f"design {did} in {str(source)!r}"
    raw = {}
    for f in NUMERIC_FIELDS:
        v = row.get(f"chip_{f}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = float(v)
        raw[f] = v
    try:
        if row.get("_design_reason"):
            vals = {f: check_quantity(v, f, optional=True, allow_zero=True) for f, v in raw.items()}
            return Chip(**{f: 0.0 if v is None else float(v) for f, v in vals.items()}, name=name, vendor="sweep")
        data = {f: (None if v == 0.0 and not NUMERIC_FIELDS[f][0] else v) for f, v in raw.items()}
        prov = {"kind": "derived", "source": f"{where} (chip_* columns)"}
        data |= {"name": name, "vendor": "sweep",
                 "provenance": {f: prov for f, v in data.items() if isinstance(v, float)}}
        chip = Chip.from_dict(data, "chip")
    except ConfigError as err:
        field = err.path.split(".", 1)[1] if err.path.startswith("chip.") else err.path
        raise ConfigError("sweep", f"{where}: chip_{field}: {err.detail}") from None
    return chip


def _validate(cfg: dict, overridden=()):
    from codesign.schema import load_hardware_preset
    from serving.architecture import ModelArchitecture
    from serving.perf import ParamSet
    from serving.precision import Precision
    from serving.scenario import Scenario, check_positions

    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(('sweep',) + KEYS[:5] + KEYS[6:])})")
    precision = Precision.from_dict(cfg["precision"], "precision")
    scenario = Scenario.from_dict(cfg["scenario"], "scenario")
    params = ParamSet.from_dict(cfg["serving"], "serving")  # presets use their vendor family's set
    if cfg.get("format") not in ("table", "json"):
        raise ConfigError("format", f"must be table or json, got {cfg.get('format')!r}")
    out = cfg.get("output")
    if not isinstance(out, str) or not out:
        raise ConfigError("output", f"expected a directory path, got {out!r}")
    check_output(out, OUTPUT_FILES)
    targets = _as_list(cfg.get("targets"), "targets")
    for i, t in enumerate(targets):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or not math.isfinite(t):
            raise ConfigError(f"targets[{i}]", f"expected an interactivity > 0 (tok/s/user), got {t!r}")
    known_w = _names("workload")
    archs = []
    for i, w in enumerate(_as_list(cfg.get("workloads"), "workloads")):
        if not isinstance(w, str) or w not in known_w:
            raise ConfigError(f"workloads[{i}]", f"unknown workload preset {w!r} (known: {', '.join(known_w)})")
        arch = ModelArchitecture.from_dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "workload" / f"{w}.yaml"),
                                                                  resolve=True), f"workloads[{i}]")
        check_positions(scenario, arch, f"workloads[{i}]")
        if scenario.draft_tokens and not arch.num_mtp_layers:
            raise ConfigError(f"workloads[{i}]", f"{w} has no MTP head for the speculative scenario {scenario.name}")
        if any(a.name == arch.name for a in archs):
            raise ConfigError(f"workloads[{i}]", f"{w!r} is listed twice")
        archs.append(arch)
    sweep = SweepDesigns(cfg["sweep_dir"]) if cfg.get("sweep_dir") else None
    known_hw = _names("hardware")
    designs = []  # (label, chip, source, row)
    for i, name in enumerate(_as_list(cfg.get("designs"), "designs")):
        name = str(name)
        path = f"designs[{i}]"
        if name in known_hw:
            designs.append((name, load_hardware_preset(name, path), "preset", None))
        elif sweep is not None and sweep.find(name) is not None:
            did = sweep.find(name)
            designs.append((did, _sweep_chip(sweep.rows[did], sweep.path), "sweep", sweep.rows[did]))
        elif sweep is not None:
            raise ConfigError(path, f"unknown design {name!r}: neither a hardware preset (known: "
                                    f"{', '.join(known_hw)}) nor a design id, name or unique id prefix of "
                                    f"{sweep.path}")
        else:
            raise ConfigError(path, f"unknown hardware preset {name!r} (known: {', '.join(known_hw)}; a design of a "
                                    f"sweep needs sweep=RUN_DIR)")
        if any(d[0] == designs[-1][0] for d in designs[:-1]):
            raise ConfigError(path, f"{name!r} is listed twice")
    return {"designs": designs, "archs": archs, "precision": precision, "scenario": scenario, "params": params,
            "targets": tuple(float(t) for t in targets), "output": out, "format": cfg["format"]}


def evaluate(args: dict):
    """Rows of every design on every workload (sweeps.runner.evaluate_rows, no Ray), one table."""
    import pyarrow as pa

    from arch_space.chip import stack
    from serving.kernel_table import build_kernel_table
    from serving.mappings import enumerate_mappings
    from serving.serve import stack_mappings
    from sweeps.runner import DesignSet, SharedInputs, evaluate_rows

    sc = args["scenario"]
    groups: dict[str, list] = {}
    for label, chip, source, row in args["designs"]:
        gen = "presets" if source == "preset" else str(row.get("generation") or "sweep")
        vendor = chip.vendor if source == "preset" else "candidate"
        groups.setdefault((gen, vendor), []).append((label, chip, source, row))
    tables = []
    for arch in args["archs"]:
        kt = build_kernel_table(arch, args["precision"])
        shared = SharedInputs(workload=arch.name, precision=args["precision"].name, scenario=sc.name, kernels=kt,
                              params=args["params"].shared, scenario_spec=sc,
                              mappings=stack_mappings(enumerate_mappings(arch, sc.max_chips)),
                              concurrency=np.asarray(sc.concurrency, dtype=np.float32),
                              families=args["params"].families)
        for (gen, vendor), items in groups.items():
            reasons = [(r or {}).get("_design_reason", "") for _, _, _, r in items]
            cost = np.asarray([float((r or {}).get("chip_cost_usd") or np.nan) for _, _, _, r in items])
            ds = DesignSet(generation=gen, design_id=[i[0] for i in items],
                           name=[c.name if s == "sweep" else label for label, c, s, _ in items],
                           kind=["preset" if s == "preset" else "candidate" for _, _, s, _ in items],
                           chips=stack([c for _, c, _, _ in items], gen), feasible=np.asarray([not r for r in reasons]),
                           reason=reasons, params={}, extra={"chip_cost_usd": cost}, vendor=vendor)
            tables.append(evaluate_rows(shared, ds))
    return pa.concat_tables(tables, promote_options="default")


def summarise(table, args: dict) -> list[dict]:
    from codesign.frontier import design_values

    order = [d[0] for d in args["designs"]]
    out = []
    for s in design_values(table, "total_tok_s_per_chip", args["targets"]):
        for t in args["targets"]:
            tpu = s.tok_per_usd[t]
            out.append({"design": s.design_id, "name": s.name, "workload": s.workload, "target_tok_s_user": t,
                        "tok_s_per_chip": s.per_chip[t], "tok_s_per_kw": s.per_kw[t],
                        "usd_per_mtok": 1e6 / tpu if tpu and np.isfinite(tpu) and tpu > 0 else float("nan"),
                        "e2e_s": s.e2e_s[t], "max_interactivity_tok_s_user": s.max_interactivity})
    wl = [a.name for a in args["archs"]]
    out.sort(key=lambda r: (wl.index(r["workload"]) if r["workload"] in wl else 99, order.index(r["design"])
                            if r["design"] in order else 99, r["target_tok_s_user"]))
    return out


def _num(v, fmt="{:,.0f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and np.isfinite(v) else "n/a"


def format_tables(values: list[dict], args: dict, reasons: dict) -> str:
    targets = args["targets"]
    lines = []
    for arch in args["archs"]:
        w = arch.name
        lines.append(f"## {w} ({args['precision'].name}) | {args['scenario'].name} | value on each design's frontier "
                     f"at matched interactivity")
        head = ["design", "max tok/s/user"]
        for t in targets:
            head += [f"tok/s/chip @{t:g}", f"tok/s/kW @{t:g}", f"$/Mtok @{t:g}"]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, _chip, source, _row in args["designs"]:
            rs = [r for r in values if r["workload"] == w and r["design"] == label]
            if not rs:
                continue
            cells = [f"{label}" + (" (sweep)" if source == "sweep" else ""),
                     _num(rs[0]["max_interactivity_tok_s_user"], "{:,.1f}")]
            for t in targets:
                r = next((x for x in rs if x["target_tok_s_user"] == t), {})
                cells += [_num(r.get("tok_s_per_chip")), _num(r.get("tok_s_per_kw")),
                          _num(r.get("usd_per_mtok"), "{:.3g}")]
            lines.append("| " + " | ".join(cells) + " |")
        for label, why in reasons.get(w, {}).items():
            lines.append(f"\n{label}: no feasible operating point ({why})")
        lines.append("")
    lines.append("n/a: the design cannot reach that interactivity (for $/Mtok also: no price known for the chip). "
                 "$/Mtok: presets at their rental price, sweep designs at owned TCO.")
    return "\n".join(lines)


def frontier_plot(table, args: dict):
    """Tokens/s per chip and per kW against interactivity, one column per workload, log axes."""
    from codesign.figures import COMP_COLORS, INTERACTIVITY_LABEL, FrontierData, finish_frontier_axes
    from codesign.plotting import plt

    data = FrontierData(table)
    wls = [a.name for a in args["archs"]]
    fig, axes = plt.subplots(2, len(wls), figsize=(max(5.4 * len(wls), 8.0), 8.6), squeeze=False,
                             layout="constrained")
    handles = {}
    for j, w in enumerate(wls):
        for r, (metric, ylabel) in enumerate((("total_tok_s_per_chip", "total tokens/s per chip"),
                                              ("total_tok_s_per_kw", "total tokens/s per kW (chip rating)"))):
            ax = axes[r][j]
            drawn = 0
            for k, (label, _c, source, _row) in enumerate(args["designs"]):
                x, y = data.frontier(label, w, metric)
                ok = (x > 0) & (y > 0)
                if ok.any():
                    (h,) = ax.plot(x[ok], y[ok], marker="o" if source == "preset" else "^", ms=3.5, lw=1.8,
                                   ls="-" if source == "preset" else "--", color=COMP_COLORS[k % len(COMP_COLORS)]
                                   if k else "black", label=label)
                    handles.setdefault(label, h)
                    drawn += 1
            finish_frontier_axes(ax, args["targets"], drawn)
            ax.set_xlabel(INTERACTIVITY_LABEL)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{w}: {ylabel}", fontsize=10)
    fig.suptitle(f"{args['scenario'].name}, {args['precision'].name}: frontiers over every mapping and concurrency "
                 f"(dotted: targets)", fontsize=11)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(5, len(handles)),
                   fontsize=8, frameon=False)
    return fig


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def run(args: dict) -> dict:
    """Evaluate, summarise and write frontier.png and results.parquet under ``args["output"]`` (checked first; the
    two files appear together or not at all)."""
    from codesign.plotting import plt
    from sweeps.store import atomic_write_table

    out_dir = check_output(args["output"], OUTPUT_FILES).resolve()
    table = evaluate(args)
    values = summarise(table, args)
    reasons: dict[str, dict[str, str]] = {}  # workload -> design -> why it has no feasible point
    feasible_pairs = set()
    for d, w, ok, why in zip(table.column("design_id").to_pylist(), table.column("workload").to_pylist(),
                             table.column("feasible").to_pylist(), table.column("reason").to_pylist()):
        if ok:
            feasible_pairs.add((w, d))
        else:
            reasons.setdefault(w, {}).setdefault(d, why or "infeasible")
    reasons = {w: {d: why for d, why in r.items() if (w, d) not in feasible_pairs} for w, r in reasons.items()}
    fig = frontier_plot(table, args)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    written = write_files(out_dir, {"frontier.png": buf.getvalue(),
                                    "results.parquet": lambda path: atomic_write_table(table, path)})
    return {"table": table, "values": values, "reasons": reasons, "figure": written["frontier.png"],
            "results": written["results.parquet"]}


def to_json(args: dict, result: dict) -> str:
    """One JSON object for scripts (NaN as null)."""
    return json.dumps(_clean({
        "precision": args["precision"].name, "scenario": args["scenario"].name,
        "targets_tok_s_user": list(args["targets"]),
        "designs": [{"design": label, "name": c.name, "source": s} for label, c, s, _ in args["designs"]],
        "workloads": [a.name for a in args["archs"]], "values": result["values"],
        "infeasible": result["reasons"], "figure": str(result["figure"]), "results": str(result["results"])}),
        indent=1)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="compare")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        args = _validate(OmegaConf.to_container(cfg, resolve=True),
                         overridden_keys(list(HydraConfig.get().overrides.task)))
        result = run(args)
    except ConfigError as err:
        fail(PROG, err)
    if args["format"] == "json":
        print(to_json(args, result))
    else:
        print(format_tables(result["values"], args, result["reasons"]))
        print(f"{PROG}: figure   {result['figure']}")
        print(f"{PROG}: results  {result['results']}")


def cli() -> None:
    from codesign.report import rewrite_argv

    sys.argv[1:] = rewrite_argv(sys.argv[1:])
    entry(PROG, "compare", _validate, _main)


if __name__ == "__main__":
    cli()
