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
import pyarrow as pa
import pyarrow.compute as pc

import arch_space
import serving
import sweeps
from arch_space.chip import NUMERIC_FIELDS, stack
from arch_space.design_space import AXES, derive_chips, design_ids
from codesign.cli import CONF_DIR
from codesign.recommend import headline_lines, recommend_from_meta
from codesign.report import write_report
from codesign.schema import Study, yaml_comments
from serving.kernel_table import build_kernel_table
from serving.mappings import enumerate_mappings, mapping_name
from serving.serve import stack_mappings
from sweeps.ray_workers import init_ray
from sweeps.runner import DesignSet, SharedInputs, run_sweep
from sweeps.store import SORT_KEYS, ResultStore, atomic_write_table, source_fingerprint

# Bump when the evaluation changes what it computes for the same inputs: part of every sweep's identity.
MODEL_VERSION = "serving-v6"  # v2: clock and HBM speed-bin axes in every design; v3: prefill lm_head on the
# last position only, the grouped-MoE rows floor (serving/perf.py); v4: TP-sharded experts all-reduce their output,
# TP degrees divide the heads, FP4 recipes' attention core at FP8, PP iterations as micro-batches; v5: the EP
# dispatch moves FP8 where the experts take quantised activations; v6: GEMM efficiency falls with the contraction
# depth, attention's rows are one sequence's (not the batch's): stored rows of older versions are not reused.
# The version is the human-readable label; MODEL_CODE (a hash of arch_space/, serving/ and sweeps/: the chips, the
# model and the runner that writes the rows) makes any source change a new sweep even where nobody bumped it.
MODEL_CODE = source_fingerprint(*(Path(pkg.__file__).parent for pkg in (arch_space, serving, sweeps)))
SERVING_DEFAULTS = CONF_DIR / "serving" / "default.yaml"  # the starting point of every fit (codesign.calibrate)
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
        params={}, extra={"chip_cost_usd": np.full(n, np.nan), "origin": np.asarray(["preset"] * n, dtype=object)})


def preset_sets(study: Study) -> list[DesignSet]:
    """The presets split by vendor: each set is evaluated with its vendor family's serving parameters."""
    ds = preset_designs(study)
    vendors = [c.vendor for c in [study.hardware] + [c for c in study.competitors if c.name != study.hardware.name]]
    out = []
    for v in sorted(set(vendors)):
        sub = ds.take([i for i, x in enumerate(vendors) if x == v])
        sub.vendor = v
        out.append(sub)
    return out


def candidate_designs(study: Study) -> list[DesignSet]:
    grid = study.space.points()
    out = []
    for gname, gen in study.generations.items():
        d = derive_chips(gen, grid, max_chip_cost_usd=study.space.max_chip_cost_usd, name=gname)
        ids = design_ids(gname, grid)
        out.append(DesignSet(generation=gname, design_id=ids, name=[f"{gname}-{i[:8]}" for i in ids],
                             kind=["candidate"] * len(ids), chips=d.chips, feasible=d.feasible, reason=d.reason,
                             params=d.params, extra={"chip_cost_usd": d.chip_cost_usd,
                                                     "origin": np.asarray([study.space.sampler] * len(ids), dtype=object)}))
    return out


def study_mappings(study: Study, arch=None):
    """The mappings searched for ``arch`` (default: the primary workload): every enumerated one up to
    scenario.max_chips, or the named subset of sweep.mappings."""
    from arch_space.errors import ConfigError

    arch = study.workload if arch is None else arch
    ms = enumerate_mappings(arch, study.scenario.max_chips)
    if study.sweep.mappings is None:
        return ms
    by_name = {mapping_name(m): m for m in ms}
    for i, n in enumerate(study.sweep.mappings):
        if n not in by_name:
            raise ConfigError(f"sweep.mappings[{i}]", f"unknown mapping {n!r} for {arch.name} up to "
                                                      f"{study.scenario.max_chips} chips (known: {', '.join(by_name)})")
    return [by_name[n] for n in study.sweep.mappings]


def sweep_definition(study: Study, design_sets: list[DesignSet], arch=None) -> dict:
    """Everything that defines the rows of one workload's sweep (and nothing about how they are computed: workers,
    batch size, paths). Refined designs (sweeps/refine.py) join the same store: they are a deterministic function
    of this definition and the primary workload's results, and a study reads back only its own designs."""
    raw = study.raw
    arch = study.workload if arch is None else arch
    ids = sorted(i for ds in design_sets for i in ds.design_id)
    return {
        "model_version": MODEL_VERSION,
        "model_code": MODEL_CODE,  # the sources that compute and write the rows: any change to them is a new sweep
        "workload": dataclasses.asdict(arch),  # the architecture itself (a preset, a mix member or an hf_config)
        "precision": raw["precision"], "scenario": raw["scenario"],
        "serving": raw["serving"], "mappings": [mapping_name(m) for m in study_mappings(study, arch)],
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
        # why each serving parameter that is not fitted has its value: the starting config's comments
        "serving_sources": yaml_comments(SERVING_DEFAULTS),
        "mix": study.mix_weights, "workloads": [a.name for a in study.workloads],
        "objective": study.report.objective, "targets": list(study.report.interactivity_targets_tok_s_user),
        "top_k": study.report.top_k, "agent_chain_steps": study.report.agent_chain_steps,
        "headline_target": headline_target(study),
    }


def _own_rows(table: pa.Table, design_sets: list[DesignSet]) -> pa.Table:
    """This study's designs only (a store may also hold refined designs of other studies), in row-key order."""
    ids = pa.array(sorted({i for ds in design_sets for i in ds.design_id}))
    table = table.filter(pc.is_in(table.column("design_id"), value_set=ids))
    return table.sort_by([(k, "ascending") for k in SORT_KEYS])


def _shared(study: Study, arch) -> SharedInputs:
    return SharedInputs(workload=arch.name, precision=study.precision.name, scenario=study.scenario.name,
                        kernels=build_kernel_table(arch, study.precision), params=study.serving,
                        scenario_spec=study.scenario, mappings=stack_mappings(study_mappings(study, arch)),
                        concurrency=np.asarray(study.scenario.concurrency, dtype=np.float32), keep=study.sweep.keep,
                        families=study.serving_set.families if study.serving_set else ())


def _sweep(study: Study, shared: SharedInputs, store: ResultStore, design_sets: list[DesignSet]) -> int:
    return run_sweep(design_sets, shared, store, batch_size=study.sweep.batch_size,
                     max_in_flight=study.sweep.max_in_flight, max_retries=study.sweep.max_retries,
                     progress=study.sweep.progress)["evaluated_designs"]


def headline_target(study: Study) -> float:
    t = study.report.interactivity_targets_tok_s_user
    return float(t[len(t) // 2])


def refined_designs(study: Study, table: pa.Table, design_sets: list[DesignSet], log=print) -> list[DesignSet]:
    """Per generation, climb the serving model's gradient from the ``space.refine_top_k`` candidates the mix
    selection ranks best at the headline interactivity target, each workload at the operating point where the
    design did best there, the workloads weighted as in the mix (sweeps/refine.py)."""
    from serving.perf import Mapping
    from sweeps.refine import refine_designs

    k, target, objective = study.space.refine_top_k, headline_target(study), study.report.objective
    rec = recommend_from_meta(table, report_meta(study))
    archs = study.workloads
    subs = {a.name: table.filter(pc.equal(table.column("workload"), a.name)) for a in archs}
    kts = [build_kernel_table(a, study.precision) for a in archs]
    mix = study.mix_weights
    known = {i for ds in design_sets for i in ds.design_id}
    out = []
    for ds in design_sets:
        if ds.kind[:1] != ["candidate"]:
            continue
        best = [d.design_id for d in rec.ranked.get(ds.generation, {}).get(target, [])][:k]
        if not best:
            log(f"codesign: {ds.generation}: no candidate reaches {target:g} tok/s/user; nothing to refine")
            continue
        index = {d: i for i, d in enumerate(ds.design_id)}
        at = np.asarray([index[d] for d in best])
        maps, conc, weights = [], np.ones((len(archs), len(best))), np.zeros((len(archs), len(best)))
        for w, arch in enumerate(archs):
            sub = subs[arch.name]
            m = np.ones((4, len(best)), np.float32)
            for j, d in enumerate(best):
                r = _best_row(sub, d, target, objective)
                if r is None:
                    continue  # no operating point at the target on this workload: weight 0
                m[:, j] = [float(sub.column(f)[r].as_py()) for f in ("tp", "dp", "ep", "pp")]
                conc[w, j] = float(sub.column("concurrency")[r].as_py())
                weights[w, j] = mix[arch.name]
            maps.append(Mapping(*m))
        start = {a: ds.params[a][at] for a in AXES}
        gen = study.generations[ds.generation]
        params, j0, j1 = refine_designs(gen, study.space, start, maps, conc, kts, study.serving, study.scenario,
                                        target, objective, weights=weights)
        ids = design_ids(ds.generation, params)
        new = [i for i, d in enumerate(ids) if d not in known and d not in ids[:i]]
        known.update(ids)
        gain = float(np.exp(np.median((j1 - j0) / np.maximum(weights.sum(0), 1e-9))))
        log(f"codesign: {ds.generation}: refined {len(new)} designs from the {len(best)} best over the mix at "
            f"{target:g} tok/s/user (weighted objective on the climb x{gain:.2f} median)")
        if not new:
            continue
        sub = {a: v[new] for a, v in params.items()}
        d = derive_chips(gen, sub, max_chip_cost_usd=study.space.max_chip_cost_usd, name=ds.generation)
        rid = [ids[i] for i in new]
        out.append(DesignSet(generation=ds.generation, design_id=rid, name=[f"{ds.generation}-r{i[:8]}" for i in rid],
                             kind=["candidate"] * len(rid), chips=d.chips, feasible=d.feasible, reason=d.reason,
                             params=d.params, extra={"chip_cost_usd": d.chip_cost_usd,
                                                     "origin": np.asarray(["refined"] * len(rid), dtype=object)}))
    return out


def _best_row(table: pa.Table, design_id: str, target: float, objective: str) -> int | None:
    """Row index of a design's best operating point at >= ``target`` tok/s/user (None if it cannot reach it)."""
    c = {k: table.column(k).to_numpy(zero_copy_only=False) for k in
         ("design_id", "feasible", "interactivity_tok_s_user", objective)}
    rows = np.flatnonzero((c["design_id"] == design_id) & c["feasible"].astype(bool)
                          & (c["interactivity_tok_s_user"] >= target))
    return int(rows[np.argmax(c[objective][rows])]) if len(rows) else None


def analysis(study: Study, table: pa.Table, rec, log=print) -> dict:
    """Sensitivities (gain per +10% of each resource and per -10% of the per-kernel overhead at matched
    interactivity, gradients checked by finite differences), time attribution and roofline points of the baseline
    and each generation's recommended design (``rec``, selected over the mix), each at the operating point where it
    does best at the headline target, on every workload of the mix (the sensitivities too: what pays differs by
    workload, e.g. DeepSeek-R1 at 100 tok/s/user is launch-overhead bound where gpt-oss-120b is compute bound)."""
    from arch_space.chip import Chip
    from serving.perf import Mapping
    from serving.sensitivity import resource_sensitivities, roofline_points, time_attribution

    target, objective = headline_target(study), study.report.objective
    featured = [d.design_id for d in [rec.baseline, *rec.best.values()] if d is not None]
    out = {"sensitivity": [], "attribution": [], "roofline": []}
    for arch in study.workloads:
        sub = table.filter(pc.equal(table.column("workload"), arch.name))
        kt = build_kernel_table(arch, study.precision)
        for design_id in featured:
            r = _best_row(sub, design_id, target, objective)
            if r is None:
                continue
            row = {k: sub.column(k)[r].as_py() for k in sub.column_names}
            chip = Chip(**{f: float(row[f"chip_{f}"]) for f in NUMERIC_FIELDS}, name=row["name"])
            m = Mapping(*(float(row[f]) for f in ("tp", "dp", "ep", "pp")))
            who = {"design_id": row["design_id"], "name": row["name"], "generation": row["generation"],
                   "workload": arch.name}
            c = float(row["concurrency"])
            params = study.params_for(study.hardware.vendor if row["kind"] == "baseline" else "candidate")
            att = time_attribution(chip, kt, params, study.scenario, m, c)
            out["attribution"] += [who | {"phase": ph} | v for ph, v in att.items()]
            out["roofline"].append(who | roofline_points(chip, kt, params, study.scenario, m, c))
            res = resource_sensitivities(chip, kt, params, study.scenario, m, target, metric=objective)
            out["sensitivity"].append(who | {"metric": objective, "target_tok_s_user": target,
                                             "mapping": row["mapping"], "resources": res})
    log(f"codesign: sensitivities of {len(out['sensitivity'])} designs, attribution and rooflines on "
        f"{len(study.workloads)} workloads")
    return out


def run_study(study: Study, run_dir: Path, *, log=print) -> dict[str, Path]:
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    design_sets = preset_sets(study) + candidate_designs(study)
    import ray

    started_here = not ray.is_initialized()
    init_ray(study.sweep.ray_address, study.sweep.num_workers)  # before JAX starts its threads (fork safety)
    root = Path(study.sweep.output_dir).resolve()
    stores, evaluated = {}, 0
    try:
        for arch in study.workloads:  # the primary workload first
            log(f"codesign: {arch.name}: tracing ({study.precision.name}) and sweeping "
                f"{sum(len(d) for d in design_sets)} designs")
            stores[arch.name] = ResultStore(root, sweep_definition(study, design_sets, arch))
            evaluated += _sweep(study, _shared(study, arch), stores[arch.name], design_sets)
        if study.space.refine_top_k:
            first = pa.concat_tables([s.read() for s in stores.values()], promote_options="default")
            extra = refined_designs(study, _own_rows(first, design_sets), design_sets, log)
            for arch in study.workloads if extra else ():
                evaluated += _sweep(study, _shared(study, arch), stores[arch.name], extra)
            design_sets = design_sets + extra
    finally:
        if started_here:
            ray.shutdown()
    table = _own_rows(pa.concat_tables([s.read() for s in stores.values()], promote_options="default"), design_sets)
    results = run_dir / "results.parquet"
    atomic_write_table(table, results)
    meta = report_meta(study)
    rec = recommend_from_meta(table, meta)
    meta |= analysis(study, table, rec, log)
    paths = write_report(run_dir, table, meta, dpi=study.report.dpi, rec=rec)
    paths["results.parquet"] = results
    log(f"codesign: sweeps {', '.join(s.sweep_id for s in stores.values())}: {evaluated} designs evaluated now "
        f"(counted once per workload), {sum(len(d) for d in design_sets)} designs x {len(stores)} workloads in the "
        f"study ({table.num_rows} rows) in {time.perf_counter() - t0:.1f} s")
    for line in headline_lines(rec):
        log(line)
    return paths


__all__ = ["run_study", "AXES"]
