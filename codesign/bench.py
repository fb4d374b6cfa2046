"""``python -m codesign.bench suite=serving|sweeps|validate``: throughput figures, as ``name: value`` lines.

suite=serving: a batch of ``designs`` Gen 2 candidate chips (random points of the design space, mapped through
the technology model) on one workload and scenario, every mapping and concurrency, evaluated by the jit-compiled,
vmapped ``serving.serve.evaluate_grid`` (after compilation; best of ``repeats``), and the same function called per
design from a plain Python loop (each call jitted for one design, also after compilation). A design-point
evaluation is one (design, mapping, concurrency). Per-core figures divide by the cores JAX's CPU backend used
(``os.sched_getaffinity``), measured in the same run, so the ratio compares like with like.

suite=validate: ``validate_rows`` reference rows (no measured values) spread over 8 models, 9 chips, the three
InferenceX scenarios and all seven metrics of the schema (model varying fastest, the metric turning with every
row, so a few hundred rows cover every model, chip and metric), predicted
by ``codesign.validate.validate_rows`` in this fresh process: the kernel tables' traces (one per model and
precision), then the rows, each timed.
"""

from __future__ import annotations

import itertools
import os
import platform
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_quantity
from codesign.cli import CONF_DIR, entry, fail

PROG = "codesign.bench"
SUITES = ("serving", "sweeps", "validate")
KEYS = ("workload", "precision", "scenario", "serving", "technology", "space", "hf_config", "suite", "designs",
        "loop_designs", "repeats", "seed", "scaling_designs", "sweep_designs", "batch_size", "workers",
        "validate_rows")


def _validate(cfg: dict, overridden=()):
    from arch_space.technology import Generation
    from codesign.schema import load_workload
    from serving.perf import ServingParams
    from serving.precision import Precision
    from serving.scenario import Scenario, check_positions

    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    if cfg["suite"] not in SUITES:
        raise ConfigError("suite", f"must be one of {', '.join(SUITES)}, got {cfg['suite']!r}")
    if cfg["suite"] == "validate":
        from serving.perf import ParamSet

        return "validate", dict(params=ParamSet.from_dict(cfg["serving"], "serving"),
                                rows=int(check_quantity(cfg["validate_rows"], "validate_rows", integer=True)))
    from arch_space.design_space import DesignSpace

    for k in ("designs", "loop_designs", "repeats", "scaling_designs", "sweep_designs", "batch_size", "workers"):
        check_quantity(cfg[k], k, integer=True)
    check_quantity(cfg["seed"], "seed", integer=True, allow_zero=True)
    common = dict(arch=load_workload(cfg), precision=Precision.from_dict(cfg["precision"], "precision"),
                  scenario=Scenario.from_dict(cfg["scenario"], "scenario"),
                  params=ServingParams.from_dict(cfg["serving"], "serving"),
                  gen=Generation.from_dict(cfg["technology"], "technology"), seed=int(cfg["seed"]))
    check_positions(common["scenario"], common["arch"], "scenario")
    if common["scenario"].draft_tokens and not common["arch"].num_mtp_layers:  # as predict and the study refuse
        raise ConfigError("scenario.draft_tokens", f"{common['arch'].name} has no MTP head for speculative decoding")
    if cfg["suite"] == "serving":
        return "serving", common | dict(designs=int(cfg["designs"]), loop_designs=int(cfg["loop_designs"]),
                                        repeats=int(cfg["repeats"]))
    space = DesignSpace.from_dict(cfg["space"], "space")
    if space.sampler == "grid":
        raise ConfigError("space", f"suite=sweeps samples its designs: pick a sobol or lhs space, got {space.name!r}")
    return "sweeps", common | dict(space=space, scaling_designs=int(cfg["scaling_designs"]),
                                   sweep_designs=int(cfg["sweep_designs"]), batch_size=int(cfg["batch_size"]),
                                   workers=int(cfg["workers"]))


def random_designs(gen, n: int, seed: int):
    from arch_space.design_space import derive_chips

    rng = np.random.default_rng(seed)
    params = {"compute_dies": rng.integers(1, gen.max_compute_dies + 1, n).astype(float),
              "sram_area_fraction": rng.uniform(0.05, 0.5, n),
              "hbm_stacks": rng.integers(4, gen.max_hbm_stacks + 1, n).astype(float),
              "power_rating_w": rng.uniform(500, gen.max_package_power_w, n),
              "scaleup_bandwidth_bytes_per_s": rng.uniform(4e11, 3.6e12, n),
              "scaleup_domain_chips": np.full(n, 64.0)}
    return derive_chips(gen, params).chips


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_serving(arch, precision, scenario, params, gen, designs, loop_designs, repeats, seed) -> dict:
    import jax

    from arch_space.chip import NUMERIC_FIELDS, Chip
    from serving.kernel_table import build_kernel_table
    from serving.mappings import enumerate_mappings
    from serving.serve import evaluate_grid, stack_mappings

    t0 = time.perf_counter()
    kt = build_kernel_table(arch, precision)
    trace_s = time.perf_counter() - t0
    maps = stack_mappings(enumerate_mappings(arch, scenario.max_chips))
    conc = np.asarray(scenario.concurrency, np.float32)
    chips = random_designs(gen, designs, seed)
    m, c = len(np.atleast_1d(maps.tp)), len(conc)

    def run_batch():
        jax.block_until_ready(evaluate_grid(chips, kt, params, scenario, maps, conc))

    t0 = time.perf_counter()
    run_batch()
    compile_s = time.perf_counter() - t0
    batch_s = _best(run_batch, repeats)
    singles = [Chip(**{f: np.asarray(getattr(chips, f))[i:i + 1] for f in NUMERIC_FIELDS}, name="d")
               for i in range(loop_designs)]

    def run_loop():
        for one in singles:
            jax.block_until_ready(evaluate_grid(one, kt, params, scenario, maps, conc))

    jax.block_until_ready(evaluate_grid(singles[0], kt, params, scenario, maps, conc))  # compile the 1-design shape
    loop_s = _best(run_loop, repeats)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    vec = designs * m * c / batch_s
    loop = loop_designs * m * c / loop_s
    return {"workload": arch.name, "scenario": scenario.name, "designs": designs, "mappings": m, "concurrencies": c,
            "design_points": designs * m * c, "kernels": kt.num_kernels, "trace_s": round(trace_s, 2),
            "compile_s": round(compile_s, 2), "batch_s": round(batch_s, 4), "cores": cores,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "vectorized_evals_per_s": round(vec), "loop_evals_per_s": round(loop),
            "vectorized_evals_per_s_per_core": round(vec / cores), "loop_evals_per_s_per_core": round(loop / cores),
            "speedup": round(vec / loop, 1)}


BENCH_MODELS = ("gpt_oss_120b", "deepseek_r1", "llama3_70b", "kimi_k2_5", "qwen3_235b_a22b", "llama4_maverick",
                "llama3_405b", "llama3_8b")
BENCH_CHIPS = ("h100_sxm", "h200_sxm", "b200", "gb200", "gb300", "mi300x", "mi325x", "mi355x", "b300")
NO_FP4 = ("h100_sxm", "h200_sxm", "mi300x", "mi325x")  # their rows run FP8 (FP4 weights would compute at FP8 anyway)


def reference_rows(n: int) -> list[dict]:
    """``n`` rows in the reference schema (no measured values) over BENCH_MODELS x BENCH_CHIPS x the InferenceX
    scenarios x every metric of the schema (total tok/s per chip at 30 and 60 tok/s/user, max interactivity, peak
    tok/s per kW, min E2E latency, max output tok/s per chip offline, disaggregated decode tok/s per chip): model
    varying fastest and the metric turning with every row (8 models, 7 metrics: every pair within 56 rows), so a
    few hundred rows cover every model, chip and metric; all 1512 rows are the whole product."""
    from codesign.reference import COLUMNS

    metrics = (("total_tput_per_chip_at_interactivity", "30"), ("total_tput_per_chip_at_interactivity", "60"),
               ("max_interactivity", ""), ("peak_total_tput_per_kw", ""), ("min_e2e_latency_s", ""),
               ("max_output_tput_per_chip", ""), ("decode_output_tput_per_chip", ""))
    base = list(itertools.product(((1024, 1024), (1024, 8192), (8192, 1024)), BENCH_CHIPS, BENCH_MODELS))
    combos = ((metrics[(j + k) % len(metrics)], *b) for k in range(len(metrics)) for j, b in enumerate(base))
    rows = []
    for i, ((metric, inter), (isl, osl), hw, model) in enumerate(itertools.islice(combos, n)):
        rows.append(dict.fromkeys(COLUMNS, "") | dict(
            id=f"bench-{i}", model=model, hardware=hw, precision="fp8" if hw in NO_FP4 else "fp4", chips="8",
            mapping="best", isl=str(isl), osl=str(osl), input_dist="uniform_0.8_1.0", speculative="none",
            metric=metric, interactivity=inter, source="codesign.bench suite=validate"))
    return rows


def bench_validate(params, rows: int) -> dict:
    import tempfile

    from codesign.fidelity import Predictor
    from codesign.reference import COLUMNS, read_reference
    from codesign.validate import validate_rows, write_csv

    predictor = Predictor(CONF_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.csv"
        write_csv(path, reference_rows(rows), COLUMNS)
        raw, specs = read_reference(path, predictor.models, predictor.hardware)
    t0 = time.perf_counter()
    firsts = {(s.model, s.precision): s for s in specs}
    for s in firsts.values():
        predictor.inputs(s)  # traces the kernel table (cached for the rows)
    trace_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    records = validate_rows(predictor, params, raw, specs)
    rows_s = time.perf_counter() - t1
    return {"rows": len(specs), "models": len({s.model for s in specs}), "chips": len({s.hardware for s in specs}),
            "kernel_tables": len(firsts), "predicted": sum(1 for r in records if r["predicted"]),
            "trace_s": round(trace_s, 1), "rows_s": round(rows_s, 1), "total_s": round(trace_s + rows_s, 1),
            "ms_per_row_after_traces": round(1e3 * rows_s / len(specs), 1),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


class PeakRSS:
    """Peak resident memory of this process plus all its descendants (the embedded Ray's GCS, raylet and workers),
    sampled on a background thread."""

    def __init__(self, every_s: float = 0.2):
        import threading

        self.peak, self.every_s, self._stop = 0, every_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil  # a dependency of ray

        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a process that exited between listing and reading
                pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def _sample_designs(space, gen, n: int, seed: int):
    import dataclasses

    from arch_space.design_space import derive_chips, design_ids
    from sweeps.runner import DesignSet

    pts = dataclasses.replace(space, samples=n, seed=seed).points()
    d = derive_chips(gen, pts, name=gen.name)
    ids = design_ids(gen.name, pts)
    return DesignSet(generation=gen.name, design_id=ids, name=ids, kind=["candidate"] * n, chips=d.chips,
                     feasible=d.feasible, reason=d.reason, params=d.params, extra={"chip_cost_usd": d.chip_cost_usd})


def bench_sweeps(arch, precision, scenario, params, gen, space, scaling_designs, sweep_designs, batch_size, workers,
                 seed) -> dict:
    import shutil
    import tempfile

    import ray

    from serving.kernel_table import build_kernel_table
    from serving.mappings import enumerate_mappings
    from serving.serve import stack_mappings
    from sweeps.ray_workers import init_ray
    from sweeps.runner import SharedInputs, run_sweep
    from sweeps.store import ResultStore

    import warnings

    # Ray starts its processes by fork + exec after JAX has threads; exec replaces the child at once, so the
    # deadlock the warning is about cannot happen (study.py starts Ray before JAX and never sees it)
    warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
    kt = build_kernel_table(arch, precision)
    maps = enumerate_mappings(arch, scenario.max_chips)
    conc = np.asarray(scenario.concurrency, np.float32)
    shared = SharedInputs(workload=arch.name, precision=precision.name, scenario=scenario.name, kernels=kt,
                          params=params, scenario_spec=scenario, mappings=stack_mappings(maps), concurrency=conc,
                          keep="frontier")
    points = len(maps) * len(conc)
    out = {"workload": arch.name, "scenario": scenario.name, "technology": gen.name, "space": space.name,
           "mappings": len(maps), "concurrencies": len(conc), "batch_size": batch_size,
           "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "machine": f"{platform.machine()} {platform.processor() or ''}".strip()}
    tmp = Path(tempfile.mkdtemp(prefix="codesign-bench-"))
    try:
        scaling = _sample_designs(space, gen, scaling_designs, seed)
        for w in (1, 2):
            init_ray(None, w)
            # compile in every worker first: enough batches that each worker surely runs one
            warm = scaling.take(range(min(len(scaling), 4 * batch_size * w)))
            run_sweep([warm], shared, ResultStore(tmp / f"warm{w}", {"bench": "warm", "w": w}),
                      batch_size=batch_size, max_in_flight=2 * w, progress=False)
            t0 = time.perf_counter()
            run_sweep([scaling], shared, ResultStore(tmp / f"scaling{w}", {"bench": "scaling", "w": w}),
                      batch_size=batch_size, max_in_flight=2 * w, progress=False)
            dt = time.perf_counter() - t0
            ray.shutdown()
            name = "1_worker" if w == 1 else "2_workers"
            out[f"scaling_{name}_wall_s"] = round(dt, 2)
            out[f"evals_per_s_{name}"] = round(int(scaling.feasible.sum()) * points / dt)
        out["scaling_designs"] = len(scaling)
        out["scaling_feasible_designs"] = int(scaling.feasible.sum())
        out["scaling"] = round(out["evals_per_s_2_workers"] / out["evals_per_s_1_worker"], 2)
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            init_ray(None, workers)
            t_ray = time.perf_counter() - t0
            big = _sample_designs(space, gen, sweep_designs, seed + 1)
            t_designs = time.perf_counter() - t0 - t_ray
            store = ResultStore(tmp / "sweep_1m", {"bench": "1m", "n": sweep_designs})
            counts = run_sweep([big], shared, store, batch_size=batch_size, max_in_flight=2 * workers, progress=True)
            wall = time.perf_counter() - t0
            ray.shutdown()
        parts = store.parts()
        import pyarrow.parquet as pq

        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
        out.update({"sweep_1m_designs": counts["evaluated_designs"], "sweep_1m_workers": workers,
                    "sweep_1m_feasible_designs": int(big.feasible.sum()),
                    "sweep_1m_evaluations": int(big.feasible.sum()) * points,
                    "sweep_1m_rows_stored": rows, "sweep_1m_parts": len(parts),
                    "sweep_1m_store_bytes": sum(p.stat().st_size for p in parts),
                    "sweep_1m_ray_start_s": round(t_ray, 2), "sweep_1m_design_generation_s": round(t_designs, 2),
                    "sweep_1m_wall_s": round(wall, 1), "sweep_1m_peak_rss_bytes": mem.peak})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="bench")
def _main(cfg: DictConfig) -> None:
    try:
        args = _validate(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as err:
        fail(PROG, err)
    suite, kwargs = args
    result = {"serving": bench_serving, "sweeps": bench_sweeps, "validate": bench_validate}[suite](**kwargs)
    for k, v in result.items():
        print(f"{k}: {v}")


def cli() -> None:
    entry(PROG, "bench", _validate, _main)


if __name__ == "__main__":
    cli()
