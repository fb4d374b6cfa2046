"""``python -m codesign.predict hardware=NAME workload=NAME precision=P scenario=NAME``: the serving frontier.

Evaluates one chip on one workload and scenario over every parallel mapping (up to ``scenario.max_chips``) and
every concurrency of the scenario, and prints the throughput-versus-interactivity Pareto frontier (InferenceX's
view): concurrency, mapping, TTFT, TPOT, E2E, interactivity, tokens/s per chip, per kW of the chip rating,
sustained power. ``format=json`` prints one JSON object for scripts; ``frontier_only=false`` prints every feasible
point; infeasible points are summarised with their reasons.
"""

from __future__ import annotations

import json

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.chip import stack
from arch_space.errors import ConfigError
from arch_space.validation import check_names
from codesign.cli import CONF_DIR, entry, fail, overridden_keys
from codesign.frontier import pareto_frontier
from codesign.schema import load_workload
from arch_space.chip import Chip
from serving.memory import INFEASIBLE_REASONS
from serving.perf import ParamSet
from serving.precision import Precision
from serving.scenario import Scenario, check_positions

PROG = "codesign.predict"
KEYS = ("hardware", "workload", "precision", "scenario", "serving", "hf_config", "format", "frontier_only", "mappings")
COLUMNS = [("concurrency", "conc", "{:.0f}"), ("mapping", "mapping", "{}"), ("ttft_s", "TTFT s", "{:.3f}"),
           ("tpot_s", "TPOT ms", "{:.2f}"), ("e2e_s", "E2E s", "{:.2f}"),
           ("interactivity_tok_s_user", "tok/s/user", "{:.1f}"), ("total_tok_s_per_chip", "tok/s/chip", "{:,.0f}"),
           ("output_tok_s_per_chip", "out tok/s/chip", "{:,.0f}"), ("total_tok_s_per_kw", "tok/s/kW", "{:,.0f}"),
           ("sustained_power_w", "power W", "{:.0f}"), ("chips", "chips", "{:.0f}")]


def _validate(cfg: dict, overridden=()):
    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    hw_over = tuple(k.split(".", 1)[1] for k in overridden if k.startswith("hardware.") and k.count(".") == 1)
    chip = Chip.from_dict(cfg["hardware"], "hardware", overridden=hw_over)
    arch = load_workload(cfg)
    precision = Precision.from_dict(cfg["precision"], "precision")
    scenario = Scenario.from_dict(cfg["scenario"], "scenario")
    check_positions(scenario, arch, "scenario")
    if scenario.draft_tokens and not arch.num_mtp_layers:
        raise ConfigError("scenario.draft_tokens", f"{arch.name} has no MTP head for speculative decoding")
    params = ParamSet.from_dict(cfg["serving"], "serving").for_vendor(chip.vendor)  # the chip's vendor family
    if cfg["format"] not in ("table", "json"):
        raise ConfigError("format", f"must be table or json, got {cfg['format']!r}")
    if not isinstance(cfg["frontier_only"], bool):
        raise ConfigError("frontier_only", f"expected true or false, got {cfg['frontier_only']!r}")
    from serving.mappings import enumerate_mappings, mapping_name

    maps = enumerate_mappings(arch, scenario.max_chips)
    if cfg["mappings"] is not None:
        by = {mapping_name(m): m for m in maps}
        for i, n in enumerate(check_names(cfg["mappings"], "mappings", what="mapping name")):
            if n not in by:
                raise ConfigError(f"mappings[{i}]", f"unknown mapping {n!r} (known: {', '.join(by)})")
        maps = [by[n] for n in cfg["mappings"]]
    return chip, arch, precision, scenario, params, maps


def predict(chip, arch, precision, scenario, params, maps) -> dict:
    from serving.kernel_table import build_kernel_table
    from serving.mappings import mapping_name
    from serving.serve import METRICS, evaluate_grid, stack_mappings

    kt = build_kernel_table(arch, precision)
    conc = np.asarray(scenario.concurrency, np.float32)
    out = evaluate_grid(stack([chip]), kt, params, scenario, stack_mappings(maps), conc)
    out = {k: np.asarray(v)[0] for k, v in out.items()}  # [M, C]
    points, infeasible = [], {}
    for i, m in enumerate(maps):
        for j, c in enumerate(scenario.concurrency):
            code = int(out["infeasible_code"][i, j])
            if code:
                key = INFEASIBLE_REASONS[code]
                infeasible.setdefault(key, []).append(f"{mapping_name(m)}@{c}")
                continue
            points.append({"concurrency": int(c), "mapping": mapping_name(m)}
                          | {k: float(out[k][i, j]) for k in METRICS})
    x = np.asarray([p["interactivity_tok_s_user"] for p in points])
    y = np.asarray([p["total_tok_s_per_chip"] for p in points])
    frontier = [points[i] for i in pareto_frontier(x, y)] if points else []
    return {"hardware": chip.name, "workload": arch.name, "precision": precision.name, "scenario": scenario.name,
            "frontier": frontier, "points": points, "infeasible": infeasible}


def format_table(result: dict, frontier_only: bool) -> str:
    rows = result["frontier"] if frontier_only else sorted(result["points"], key=lambda p: (p["mapping"],
                                                                                             p["concurrency"]))
    head = [h for _, h, _ in COLUMNS]
    body = []
    for p in rows:
        vals = []
        for key, _, fmt in COLUMNS:
            v = p[key] * 1000 if key == "tpot_s" else p[key]
            vals.append(fmt.format(v))
        body.append(vals)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]
    lines = [f"{result['hardware']} | {result['workload']} ({result['precision']}) | {result['scenario']} | "
             f"{'Pareto frontier' if frontier_only else 'all feasible points'}: {len(rows)} points"]
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in body]
    for reason, where in result["infeasible"].items():
        lines.append(f"infeasible ({len(where)} points): {reason}, e.g. {', '.join(where[:4])}")
    if not rows:
        lines.append("no feasible operating point")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="predict")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        args = _validate(OmegaConf.to_container(cfg, resolve=True),
                         overridden_keys(list(HydraConfig.get().overrides.task)))
        result = predict(*args)
    except ConfigError as err:
        fail(PROG, err)
    if cfg.format == "json":
        print(json.dumps(result if not cfg.frontier_only else {k: v for k, v in result.items() if k != "points"},
                         indent=1))
    else:
        print(format_table(result, bool(cfg.frontier_only)))


def cli() -> None:
    entry(PROG, "predict", _validate, _main)


if __name__ == "__main__":
    cli()
