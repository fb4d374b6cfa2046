"""``python -m codesign.bench suite=serving``: throughput of the vectorised serving model, as ``name: value`` lines.

suite=serving: a batch of ``designs`` Gen 2 candidate chips (random points of the design space, mapped through
the technology model) on one workload and scenario, every mapping and concurrency, evaluated by the jit-compiled,
vmapped ``serving.serve.evaluate_grid`` (after compilation; best of ``repeats``), and the same function called per
design from a plain Python loop (each call jitted for one design, also after compilation). A design-point
evaluation is one (design, mapping, concurrency). Per-core figures divide by the cores JAX's CPU backend used
(``os.sched_getaffinity``), measured in the same run, so the ratio compares like with like.
"""

from __future__ import annotations

import os
import platform
import time

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_quantity
from codesign.cli import CONF_DIR, entry, fail

PROG = "codesign.bench"
SUITES = ("serving",)
KEYS = ("workload", "precision", "scenario", "serving", "technology", "hf_config", "suite", "designs", "loop_designs",
        "repeats", "seed")


def _validate(cfg: dict, overridden=()):
    from arch_space.technology import Generation
    from codesign.schema import load_workload
    from serving.perf import ServingParams
    from serving.precision import Precision
    from serving.scenario import Scenario

    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    if cfg["suite"] not in SUITES:
        raise ConfigError("suite", f"must be one of {', '.join(SUITES)}, got {cfg['suite']!r}")
    for k in ("designs", "loop_designs", "repeats"):
        check_quantity(cfg[k], k, integer=True)
    check_quantity(cfg["seed"], "seed", integer=True, allow_zero=True)
    return dict(arch=load_workload(cfg), precision=Precision.from_dict(cfg["precision"], "precision"),
                scenario=Scenario.from_dict(cfg["scenario"], "scenario"),
                params=ServingParams.from_dict(cfg["serving"], "serving"),
                gen=Generation.from_dict(cfg["technology"], "technology"), designs=int(cfg["designs"]),
                loop_designs=int(cfg["loop_designs"]), repeats=int(cfg["repeats"]), seed=int(cfg["seed"]))


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


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="bench")
def _main(cfg: DictConfig) -> None:
    try:
        args = _validate(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as err:
        fail(PROG, err)
    result = bench_serving(**args)
    for k, v in result.items():
        print(f"{k}: {v}")


def cli() -> None:
    entry(PROG, "bench", _validate, _main)


if __name__ == "__main__":
    cli()
