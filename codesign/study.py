"""The main job's pipeline: config -> designs -> Ray sweep -> Parquet -> recommendation -> figures and report.

:func:`run_study` is what ``codesign`` (no arguments) runs. It evaluates the baseline chip (``hardware``), the
competitor presets and every candidate of each generation's design space on one workload / precision / scenario,
stores the rows in the persistent result store (resuming what exists), copies this study's rows to
``results.parquet`` in the run directory and writes the report beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np

from arch_space.chip import NUMERIC_FIELDS, stack
from arch_space.design_space import AXES, derive_chips, design_ids
from codesign.recommend import design_values, recommend
from codesign.report import write_report
from codesign.schema import Study
from serving.kernel_table import build_kernel_table
from serving.mappings import enumerate_mappings, mapping_name
from serving.serve import stack_mappings
from sweeps.runner import DesignSet, SharedInputs, init_ray, run_sweep
from sweeps.store import ResultStore, atomic_write_table

# Bump when the evaluation changes what it computes for the same inputs: part of every sweep's identity.
MODEL_VERSION = "serving-v2"  # v2: clock and HBM speed-bin axes in every design
MODEL_NOTE = ("kernel-level serving model over the traced operator graph (serving/serve.py) with the serving "
              "parameters of conf/serving (the default, calibrated.yaml, is fitted to measured_calibration.csv: see "
              "its median and p90 errors under Assumptions); differences between designs are more reliable than "
              "absolute figures")


def _preset_id(chip) -> str:
    key = {"name": chip.name} | {f: float(getattr(chip, f)) for f in NUMERIC_FIELDS}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def preset_designs(study: Study) -> DesignSet:
    chips = [study.hardware] + [c for c in study.competitors if c.name != study.hardware.name]
    kinds = ["baseline"] + ["competitor"] * (len(chips) - 1)
    n = len(chips)
    return DesignSet(
        generation="presets", design_id=[_preset_id(c) for c in chips], name=[c.name for c in chips], kind=kinds,
        chips=stack(chips, "presets"), feasible=np.ones(n, bool), reason=[""] * n,
        params={}, extra={"chip_cost_usd": np.full(n, np.nan)})


def candidate_designs(study: Study) -> list[DesignSet]:
    grid = study.space.points()
    out = []
    for gname, gen in study.generations.items():
        d = derive_chips(gen, grid, max_chip_cost_usd=study.space.max_chip_cost_usd, name=gname)
        ids = design_ids(gname, grid)
        out.append(DesignSet(generation=gname, design_id=ids, name=[f"{gname}-{i[:8]}" for i in ids],
                             kind=["candidate"] * len(ids), chips=d.chips, feasible=d.feasible, reason=d.reason,
                             params=d.params, extra={"chip_cost_usd": d.chip_cost_usd}))
    return out


def study_mappings(study: Study):
    """The mappings searched: every enumerated one up to scenario.max_chips, or the named subset of sweep.mappings."""
    from arch_space.errors import ConfigError

    ms = enumerate_mappings(study.workload, study.scenario.max_chips)
    if study.sweep.mappings is None:
        return ms
    by_name = {mapping_name(m): m for m in ms}
    for i, n in enumerate(study.sweep.mappings):
        if n not in by_name:
            raise ConfigError(f"sweep.mappings[{i}]", f"unknown mapping {n!r} for {study.workload.name} up to "
                                                      f"{study.scenario.max_chips} chips (known: {', '.join(by_name)})")
    return [by_name[n] for n in study.sweep.mappings]


def sweep_definition(study: Study, design_sets: list[DesignSet]) -> dict:
    """Everything that defines the rows (and nothing about how they are computed: workers, batch size, paths)."""
    raw = study.raw
    ids = sorted(i for ds in design_sets for i in ds.design_id)
    return {
        "model_version": MODEL_VERSION,
        "workload": raw["workload"], "precision": raw["precision"], "scenario": raw["scenario"],
        "serving": raw["serving"], "mappings": [mapping_name(m) for m in study_mappings(study)],
        "keep": study.sweep.keep,
        "generations": raw["generation"],
        "presets": {ds_name: {f: float(getattr(c, f)) for f in NUMERIC_FIELDS}
                    for ds_name, c in [(c.name, c) for c in [study.hardware, *study.competitors]]},
        "designs_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
    }


def report_meta(study: Study) -> dict:
    hw = study.hardware
    return {
        "title": study.report.title, "study_name": study.study_name,
        "workload": study.workload.name, "precision": study.precision.name, "scenario": study.scenario.name,
        "hardware_name": hw.name, "hardware_values": hw.to_dict(),
        "hardware_provenance": {f: dataclasses.asdict(p) for f, p in hw.provenance},
        "generations": {k: v for k, v in study.raw["generation"].items()},
        "serving": study.raw["serving"], "model_note": MODEL_NOTE, "config": study.raw,
    }


def run_study(study: Study, run_dir: Path, *, log=print) -> dict[str, Path]:
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    design_sets = [preset_designs(study)] + candidate_designs(study)
    import ray

    started_here = not ray.is_initialized()
    init_ray(study.sweep.ray_address, study.sweep.num_workers)  # before JAX starts its threads (fork safety)
    log(f"codesign: tracing {study.workload.name} ({study.precision.name}) into its operator graph")
    kernels = build_kernel_table(study.workload, study.precision)
    shared = SharedInputs(workload=study.workload.name, precision=study.precision.name,
                          scenario=study.scenario.name, kernels=kernels, params=study.serving,
                          scenario_spec=study.scenario, mappings=stack_mappings(study_mappings(study)),
                          concurrency=np.asarray(study.scenario.concurrency, dtype=np.float32),
                          keep=study.sweep.keep)
    store = ResultStore(Path(study.sweep.output_dir).resolve(), sweep_definition(study, design_sets))
    try:
        counts = run_sweep(design_sets, shared, store, batch_size=study.sweep.batch_size,
                           max_in_flight=study.sweep.max_in_flight, max_retries=study.sweep.max_retries,
                           progress=study.sweep.progress)
    finally:
        if started_here:
            ray.shutdown()
    table = store.read()
    results = run_dir / "results.parquet"
    atomic_write_table(table, results)
    rec = recommend(table, study.report.objective, study.report.interactivity_targets_tok_s_user, study.report.top_k)
    summaries = design_values(table, study.report.objective, rec.targets)
    paths = write_report(run_dir, table, rec, summaries, report_meta(study), dpi=study.report.dpi)
    paths["results.parquet"] = results
    log(f"codesign: sweep {store.sweep_id}: {counts['evaluated_designs']} designs evaluated now, "
        f"{sum(len(d) for d in design_sets)} in the study ({table.num_rows} rows) in {time.perf_counter() - t0:.1f} s")
    for g, best in rec.best.items():
        if best is None:
            log(f"codesign: {g}: no candidate reaches {rec.headline_target:g} tok/s/user")
        else:
            log(f"codesign: {g} best at {rec.headline_target:g} tok/s/user: {best.design_id} "
                f"{rec.objective}={best.values[rec.headline_target]:,.0f} "
                f"({rec.gain(best, rec.baseline):.2f}x the baseline {study.hardware.name})")
    return paths


__all__ = ["run_study", "AXES"]
