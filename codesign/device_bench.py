"""The local JAX device as a chip: how fast it multiplies and streams, and the serving parameters that follow
(``python -m codesign.execute`` builds its prediction on these; what the device is: codesign/device_info.py).

The chip is the device itself, described from micro-benchmarks run in the same process (:func:`device_chip`):

- ``bf16_flops_per_s``: the achieved rate of a large square matmul in the *execution* dtype (float32 on CPUs, filed
  under the bf16 slot because serving.precision has no fp32 math dtype: the fp32 recipe computes its matmuls "in
  bf16", i.e. at this rate). fp8 / int8 / fp4 are unset, so every math dtype falls back to it;
- ``hbm_bandwidth_bytes_per_s``: the achieved rate of a weight-streaming GEMV ``x[1, K] @ W[K, N]`` over
  ``bench.stream_bytes`` of weights, decode's weight-GEMM access pattern (a plain reduction ``sum(W)`` streams
  differently and is reported for reference only);
- SRAM: the last-level cache (CPU: the size sysfs reports; accelerators: an assumed 50 MiB) at the bandwidth of
  the same GEMV over a quarter of it, as a *cache* (``sram_explicit_fraction`` 0: it serves a step only when all of
  the step's weights and KV fit, and adds no capacity);
- HBM capacity: the device's memory (CPU: MemTotal; accelerators: the allocator's limit);
- one chip in its "scale-up domain"; link, power and energy figures are documented placeholders (``kind: assumed``):
  they enter power and energy, never ``step_time`` at ``Mapping()``.

Serving parameters: ``conf/serving/default.yaml`` (the ``serving`` group) is loaded; ``params`` says which of its
values the micro-benchmarks replace (every mode's prediction is in the JSON, the other modes' ratios under the
table):

- ``config``: none, the serving config as is;
- ``rates``: the efficiency maxima (``gemm_`` / ``attention_`` / ``moe_efficiency_max``, ``memory_efficiency_max``)
  become 1, because the chip's math rate and bandwidth are *achieved* rates (a large matmul reaches e_max by
  definition, the GEMV stream the achievable bandwidth): the config's 0.6-0.85 on top would count the inefficiency
  twice. ``kernel_overhead_s`` becomes the measured cost of one more small kernel inside a jitted program and
  ``step_overhead_s`` the measured dispatch of a jitted call (the config's 4 us / 0.2 ms are GPU serving-engine
  figures with sampling and scheduling, which this harness does not run);
- ``run``: ``rates``, and the GEMM efficiency curve ``e_max x rows / (rows + rows_half)`` (also used for the
  grouped MoE GEMMs, which run the same dots) fitted to a GEMM row sweep ``x[M, 4096] @ W[4096, N]`` (W half of
  ``bench.stream_bytes``) over M = 1, 2, 4, ... up to the run's largest row count (:func:`fit_gemm_curve`: least
  squares of log time of the serving model's own kernel time);
- ``phase`` (default): as ``run``, with one curve per step fitted to the sweep's rows around the step's own: M =
  B/2 .. 2B for a decode step of B sequences, M = T/4 .. T for the prefill (:func:`phase_rows`). The device's GEMM
  rate is thereby characterised at the row counts each step runs (on synthetic matrices); how the serving model
  composes kernels of other shapes, attention and overheads into a step stays under test. XLA:CPU needs this: a
  1-row product runs as a bandwidth-bound GEMV, products of 2-32 rows take a slow small-GEMM path (M = 2 took 1.9x
  the time of M = 1 on this VM; their time grows like M^0.6 after that) and from ~64 rows the blocked GEMM
  approaches the square-matmul rate, which no single curve of the serving model's form follows (the ``run`` fit's
  residuals and ratios show by how much; one decode curve over M = 1 .. 16 put M = 1 at 1.3x its time, and decode
  B = 1 at 1.3-1.4x measured). Each step's curve is exact at the step's own row count where the form allows
  (``anchor``; the neighbours settle the rest), and its sweep rows and the streaming GEMV are timed in the same
  rounds as the step (``codesign.device_refs``), so the step is predicted from the machine it ran on: this VM's
  DRAM bandwidth switches between ~28 and ~44 GB/s in spells of seconds while its matmul rate holds, and a decode
  step timed a minute after the micro-benchmarks read 0.76-1.59x of its prediction from run to run (llama3_8b's
  decode steps 1.02-1.09x in five runs since, 2026-12-07). The fits use synthetic matrices, never the model's.

A depth sweep (:func:`depth_sweep`, a compute-bound GEMM at K = 128..8192) measures the device's own side of the
serving model's contraction-depth term (``gemm_k_half``, fitted by :func:`fit_depth_curve`). Modes ``phase`` and
``run`` use it: the row sweep runs at one depth (K = 4096), so its curve's maximum is divided by the depth factor
there and a kernel K deep runs at the row curve's rate times the depth curve's ratio between K and 4096 (projections
of a wide model contract over 4096-29k, a small model's over a few hundred). ``execute`` prints the fit beside the
config's value (the calibration's, fitted to GPU serving results), on an accelerator an independent check of it.

The attention curve (``attention_rows_half``) and the memory ramp (``memory_bytes_half``) stay as configured in
every mode: they are the serving model's claims under test. ``execute`` also sweeps the model code's attention over
the rows of one sequence and prints the device's own curve beside the config's (codesign/device_attention.py).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from codesign.device_refs import References
from codesign.device_timing import interleaved, timed, wall_samples


def sweep_rows(batches, prefill_tokens) -> list[int]:
    """Row counts of the GEMM sweep: powers of two up to the largest of the run, and the run's own counts."""
    top = max(max(batches), prefill_tokens)
    rows = {1 << i for i in range(int(np.log2(top)) + 1)} | set(batches) | {prefill_tokens}
    return sorted(rows)


def microbenchmarks(dtype_name: str, info: dict, bench: dict, refs: References, experts: bool = False) -> dict:
    """The device in the execution dtype: achieved square-matmul FLOP/s, GEMV weight-streaming bandwidth (and a
    reduction's, for reference), in-cache GEMV bandwidth, dispatch of a jitted call, the cost of one more small
    kernel inside a jitted program, the GEMM row sweep of ``refs`` and, with ``experts``, the streaming rate of
    GEMVs on dynamically indexed slices of a stacked weight (what the grouped MoE kernel does; reported, not used
    by the prediction)."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype_name)
    cpu = info["platform"] == "cpu"
    reps, st = bench["repeats"], bench.get("stat", "median")
    out = {}
    n = bench["matmul_size"] or (2048 if cpu else 8192)
    # random operands: a GPU's power-limited GEMM runs measurably faster on constant or zero data (fewer bit
    # toggles) than on the model's random weights
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dtype)
    b = jax.random.normal(kb, (n, n), dtype)
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(dtype))
    if not cpu:  # an idle GPU sits at a low clock (an H200 idles near 345 of 1980 MHz): ramp it up before timing
        t_end = time.perf_counter() + 0.5
        while time.perf_counter() < t_end:
            jax.block_until_ready([mm(a, b) for _ in range(8)])
    out["matmul_flops_per_s"] = 2.0 * n ** 3 / timed(mm, (a, b), reps, stat=st)
    out["matmul_shape"] = f"{n}x{n} @ {n}x{n} {dtype_name}"
    del a, b
    gemv, (x, w_stream) = refs.stream
    k = x.shape[1]
    out["stream_shape"] = refs.stream_shape
    red = jax.jit(lambda w: jnp.sum(w, dtype=jnp.float32))
    out["reduce_bytes_per_s"] = w_stream.nbytes / timed(red, (w_stream,), reps, stat=st)
    small_cols = max(int(info["cache_bytes"] / 4) // (k * dtype.itemsize), 8)
    w = jnp.full((k, small_cols), 0.5, dtype)
    out["cache_bytes_per_s"] = w.nbytes / timed(gemv, (x, w), max(reps, 10), stat=st)
    out["cache_shape"] = f"1x{k} @ {k}x{small_cols} {dtype_name} ({w.nbytes / 2 ** 20:.0f} MiB)"
    del w
    one = jnp.ones((), jnp.float32)
    # overheads: the minimum of many runs (microseconds, where the median of a shared machine is mostly noise)
    out["dispatch_s"] = float(wall_samples(jax.jit(lambda v: v + 1.0), (one,), 100, warmup=10).min())

    def chain(length):
        def f(x, m):
            for _ in range(length):
                x = jnp.dot(x, m)
            return x
        return jax.jit(f)

    xs, ms = jnp.full((16, 16), 0.01, dtype), jnp.full((16, 16), 0.01, dtype)
    t1 = wall_samples(chain(1), (xs, ms), 100, warmup=10).min()
    t257 = wall_samples(chain(257), (xs, ms), 100, warmup=10).min()
    out["kernel_overhead_s"] = float(max((t257 - t1) / 256.0, 0.0))
    # the GEMM row sweep interleaved with the streaming GEMV: the decode fit splits each point's time into memory
    # (at the streaming rate) and compute, so both must see the machine in the same state
    calls, rows = refs.calls()
    out |= refs.bench(interleaved(calls, max(reps, 5), stat=st), rows)
    out["depth_sweep"] = depth_sweep(dtype, cpu, reps, st)
    if experts:  # 8 of 16 stacked [4096, n] matrices, picked by traced indices inside one jitted loop
        kk = refs.k
        ne = max(int(refs.stream_bytes) // 2 // (16 * kk * dtype.itemsize), 8)
        stack = jnp.full((16, kk, ne), 0.5, dtype)
        ids = jnp.arange(0, 16, 2, dtype=jnp.int32)
        xe = jnp.full((1, kk), 0.5, dtype)

        def picked(x, w, ids):
            def body(i, acc):
                we = jax.lax.dynamic_index_in_dim(w, ids[i], 0, keepdims=False)
                return acc + jnp.dot(x, we, preferred_element_type=jnp.float32)
            return jax.lax.fori_loop(0, 8, body, jnp.zeros((1, w.shape[2]), jnp.float32))

        t = timed(jax.jit(picked), (xe, stack, ids), reps, stat=st)
        out["expert_slice_bytes_per_s"] = 8 * kk * ne * dtype.itemsize / t
        out["expert_slice_shape"] = f"1x{kk} @ [16, {kk}, {ne}][e] {dtype_name}, 8 experts"
        del stack
    return out


def fit_gemm_curve(mb: dict, base, lo: float = 0, hi: float = float("inf"), anchor: int | None = None) -> dict:
    """Fit the serving model's GEMM efficiency curve e_max x rows / (rows + rows_half) to the row sweep's points
    with ``lo <= rows <= hi``: the kernel time ``max(FLOPs / (rate x eff), bytes / bandwidth x (1 +
    memory_bytes_half / bytes)) + kernel_overhead`` (serving.perf.kernel_times with the device chip, memory
    efficiency 1), least squares of log time, e_max in (0, 1], rows_half >= 0. With ``anchor`` (a row count of the
    sweep: the step's own), the fit is first as close as the curve can come at the anchor (within 1% of the best
    there) and least squares over the window among those: XLA:CPU's sweep has shapes no curve of this form follows
    (M = 2 at 2.7x the time of M = 1, where the form allows at most 2x), and a plain fit over M = 1..2 split the
    difference, putting decode B = 1 at 1.15-1.19x its measured time. Returns the fit and its predicted / measured
    time per row count."""
    sw = mb["gemm_sweep"]
    k, n = sw["k"], sw["n"]
    item = 4 if sw["dtype"] == "float32" else 2
    keep = [i for i, r in enumerate(sw["rows"]) if lo <= r <= hi]
    rows = np.asarray([sw["rows"][i] for i in keep], np.float64)
    meas = np.asarray([sw["seconds"][i] for i in keep], np.float64)
    rate, bw = mb["matmul_flops_per_s"], mb["stream_bytes_per_s"]
    nbytes = (k * n + rows * (k + n)) * item
    t_mem = nbytes / bw * (1.0 + base.memory_bytes_half / nbytes)
    e = np.linspace(0.02, 1.0, 50)[:, None, None]
    h = np.concatenate([[0.0], np.logspace(-1, 3.5, 360)])[None, :, None]
    t_cmp = 2.0 * rows * k * n / rate / e * (1.0 + h / rows)
    model = np.maximum(t_cmp, t_mem) + mb["kernel_overhead_s"]
    err = np.sum(np.log(model / meas) ** 2, axis=-1)
    if anchor is not None:
        a = [int(r) for r in rows].index(anchor)
        at = np.abs(np.log(model[..., a] / meas[a]))
        err = np.where(at <= at.min() + 0.01, err, np.inf)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    best = model[i, j]
    return {"gemm_efficiency_max": float(e[i, 0, 0]), "gemm_rows_half": float(h[0, j, 0]),
            "predicted_over_measured": [float(v) for v in best / meas], "rows": [int(r) for r in rows],
            "anchor": anchor}


DEPTHS = (128, 256, 512, 1024, 2048, 4096, 8192)


def depth_sweep(dtype, cpu: bool, reps: int, stat: str) -> dict:
    """Times of x[M, K] @ W[K, N] over the contraction depths ``DEPTHS`` at a row count where the GEMM is compute
    bound (M = 256, N = 1024 on CPUs; 4096 x 8192 elsewhere): the device's own side of the serving model's depth
    term (``gemm_k_half``, fitted to GPU serving results by the calibration; :func:`fit_depth_curve`)."""
    import jax
    import jax.numpy as jnp

    m, n = (256, 1024) if cpu else (4096, 8192)
    mm = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(dtype))
    seconds = []
    for k in DEPTHS:
        kx, kw = jax.random.split(jax.random.key(k))
        x, w = jax.random.normal(kx, (m, k), dtype), jax.random.normal(kw, (k, n), dtype)
        seconds.append(timed(mm, (x, w), max(reps, 5), stat=stat))
        del x, w
    return {"m": m, "n": n, "k": list(DEPTHS), "seconds": seconds, "dtype": jnp.dtype(dtype).name}


def fit_depth_curve(sweep: dict) -> dict:
    """Fit rate(K) = rate_inf x K / (K + k_half) to a :func:`depth_sweep`: least squares of log rate over a grid of
    k_half (0 and 1 .. 1e5, log-spaced), rate_inf in closed form for each (the mean log residual). Returns k_half,
    rate_inf and the fit's predicted / measured time per depth. ``execute`` prints it beside the serving config's
    value, and its ``phase`` and ``run`` predictions take their depth term from it (:func:`device_params`)."""
    k = np.asarray(sweep["k"], np.float64)
    rate = 2.0 * sweep["m"] * k * sweep["n"] / np.asarray(sweep["seconds"], np.float64)
    h = np.concatenate([[0.0], np.logspace(0, 5, 1001)])[:, None]
    shape = np.log(k / (k + h))  # [H, K]
    log_inf = np.mean(np.log(rate) - shape, axis=1, keepdims=True)
    err = np.sum((np.log(rate) - log_inf - shape) ** 2, axis=1)
    i = int(np.argmin(err))
    model = np.exp(log_inf[i, 0] + shape[i])
    return {"gemm_k_half": float(h[i, 0]), "rate_inf_flops_per_s": float(np.exp(log_inf[i, 0])),
            "predicted_over_measured": [float(v) for v in rate / model]}


def step_key(phase: str, rows: int) -> str:
    """The name of a step's curve in :func:`phase_rows` (``decode B=8``, ``prefill``)."""
    return f"decode B={rows}" if phase == "decode" else "prefill"


def phase_rows(batches, prefill_tokens) -> dict:
    """The sweep's row range of each fit: one per decode batch B (B/2 .. 2B: the sweep holds B and the powers of two
    around it, so at least two points), the prefill (a quarter of the prefill tokens .. the prefill tokens), run
    (everything)."""
    out = {step_key("decode", b): (b / 2, 2 * b) for b in batches}
    return out | {"prefill": (prefill_tokens / 4, prefill_tokens), "run": (0, float("inf"))}


def device_chip(info: dict, mb: dict, dtype_name: str):
    """The local device as an :class:`arch_space.chip.Chip` (every field present; provenance per figure)."""
    from arch_space.chip import Chip

    cpu = info["platform"] == "cpu"
    cores = info.get("cores", 1)
    measured = lambda what: {"kind": "measured", "source": f"codesign.execute micro-benchmark: {what}"}  # noqa
    assumed = lambda why: {"kind": "assumed",  # noqa: E731
                           "source": f"assumed ({why}); power and energy do not enter the step time"}
    if cpu:
        power, idle = 8.0 * cores, 2.0 * cores
        p_src = f"8 W per core x {cores} cores (server x86 cores draw ~5-10 W each under AVX load), idle 25%"
        e_flop, e_mem, m_src = 1.0e-12, 1.6e-10, "FP32 AVX-512 FMA ~1 pJ/FLOP; DDR4/5 ~20 pJ/bit = 160 pJ/byte"
    else:
        power, idle = 700.0, 140.0
        p_src = "700 W, an H100/H200 SXM-class rating, idle 20%"
        e_flop, e_mem, m_src = 1.282e-13, 3.12e-11, "the h200_sxm preset's FP8 and HBM3E energies"
    cache_bw = max(mb["cache_bytes_per_s"], mb["stream_bytes_per_s"])
    data = {
        "name": f"{info['platform']}:{info['device_kind']}".replace(" ", "_"),
        "vendor": info.get("processor", info["device_kind"]) or "unknown",
        "description": f"the local JAX device, described from micro-benchmarks in {dtype_name}",
        "bf16_flops_per_s": mb["matmul_flops_per_s"], "fp8_flops_per_s": None, "int8_flops_per_s": None,
        "fp4_flops_per_s": None,
        "sram_capacity_bytes": info["cache_bytes"], "sram_bandwidth_bytes_per_s": cache_bw,
        "hbm_capacity_bytes": info["memory_bytes"] or 1.0, "hbm_bandwidth_bytes_per_s": mb["stream_bytes_per_s"],
        "scaleup_bandwidth_bytes_per_s": 1.0e10, "scaleup_latency_s": 1.0e-6, "scaleup_domain_chips": 1,
        "scaleout_bandwidth_bytes_per_s": 1.25e9, "power_rating_w": power, "idle_power_w": idle,
        "allin_power_w": None, "die_area_m2": None, "rental_usd_per_s": None,
        "fp8_energy_j_per_flop": e_flop, "hbm_energy_j_per_byte": e_mem, "sram_energy_j_per_byte": 5.0e-12,
        "link_energy_j_per_byte": 4.4e-11, "sram_explicit_fraction": 0.0,
        "provenance": {
            "bf16_flops_per_s": measured(f"median rate of a {mb['matmul_shape']} matmul (float32 accumulation): the "
                                         f"execution dtype's achieved rate, in the bf16 slot (no fp32 math dtype)"),
            "sram_capacity_bytes": ({"kind": "measured", "source": info["cache_source"]} if cpu and
                                    info["cache_source"].startswith("sysfs")
                                    else {"kind": "assumed", "source": info["cache_source"]}),
            "sram_bandwidth_bytes_per_s": measured(f"GEMV {mb['cache_shape']}, a quarter of the last-level cache "
                                                   f"(at least the streaming bandwidth)"),
            "hbm_capacity_bytes": measured("MemTotal (/proc/meminfo)" if cpu else "the allocator's bytes_limit"),
            "hbm_bandwidth_bytes_per_s": measured(f"weights streamed by a GEMV {mb['stream_shape']} (decode's "
                                                  f"weight-GEMM access pattern)"),
            "scaleup_bandwidth_bytes_per_s": assumed("one device: no scale-up link is used at tp = ep = 1"),
            "scaleup_latency_s": assumed("one device: 1 us, unused at tp = ep = 1"),
            "scaleup_domain_chips": assumed("the one local device"),
            "scaleout_bandwidth_bytes_per_s": assumed("a 10 GbE NIC, unused"),
            "power_rating_w": assumed(p_src), "idle_power_w": assumed(p_src),
            "fp8_energy_j_per_flop": assumed(m_src), "hbm_energy_j_per_byte": assumed(m_src),
            "sram_energy_j_per_byte": assumed("5 pJ/byte, the N5-class global SRAM figure of the presets"),
            "link_energy_j_per_byte": assumed("44 pJ/byte, the presets' 112G SerDes figure; unused"),
            "sram_explicit_fraction": assumed("a hardware-managed cache: it serves a step only when all of it fits"),
        },
    }
    return Chip.from_dict(data, "device")


PARAM_MODES = ("phase", "run", "rates", "config")
MODE_TEXT = {"phase": "efficiency maxima 1, GEMM/MoE curve fitted to the sweep's rows around each step's (B/2..2B, "
                      "T/4..T; exact at its own rows where the curve can be), those rows and the weight stream "
                      "timed with the step, the depth sweep's k_half, overheads measured, the rest from the "
                      "serving config",
             "run": "efficiency maxima 1, one GEMM/MoE curve fitted to the whole sweep, the depth sweep's k_half, "
                    "overheads measured, the rest from the serving config",
             "rates": "efficiency maxima 1, overheads measured, the rest from the serving config",
             "config": "the serving config as is"}


def device_params(base, mb: dict, mode: str, fit: dict | None = None, depth: dict | None = None):
    """ServingParams for the device chip and where each replaced value came from (module docstring); ``fit``: the
    GEMM curve of modes ``phase`` and ``run``; ``depth``: the depth sweep's fit (:func:`fit_depth_curve`), which
    modes ``phase`` and ``run`` then use as the device's own depth term (0 without it)."""
    if mode == "config":
        return base, {"all": "serving config, as is"}
    changes = {"gemm_efficiency_max": 1.0, "attention_efficiency_max": 1.0, "moe_efficiency_max": 1.0,
               "memory_efficiency_max": 1.0, "kernel_overhead_s": mb["kernel_overhead_s"],
               "step_overhead_s": mb["dispatch_s"]}
    sources = {k: "1: the chip's rates are achieved rates" for k in changes if k.endswith("_max")}
    sources["kernel_overhead_s"] = "measured: one more small dot inside a jitted program"
    sources["step_overhead_s"] = ("measured: a no-op jitted call with the step's own arguments (donated cache, "
                                  "every weight leaf), at least the dispatch of a scalar call")
    if mode in ("phase", "run") and fit is not None:
        for kind in ("gemm", "moe"):
            changes[f"{kind}_efficiency_max"] = fit["gemm_efficiency_max"]
            changes[f"{kind}_rows_half"] = fit["gemm_rows_half"]
            for f in ("efficiency_max", "rows_half"):
                sources[f"{kind}_{f}"] = "fitted to the GEMM row sweep (the grouped MoE kernel runs the same dots)"
        changes["moe_rows_floor"] = 0.0
        sources["moe_rows_floor"] = "0: the fitted curve is the device's own down to one row"
        # The row sweep runs at one depth K_ref, so its curve already carries the depth factor K_ref / (K_ref +
        # k_half): the curve's maximum is divided by it, and a kernel K deep then runs at the sweep's rate x
        # [K / (K + k_half)] / [K_ref / (K_ref + k_half)]: the row curve at K_ref, the depth curve's shape around it.
        # The maximum may pass 1: it is relative to the square matmul's rate, at unbounded depth.
        kh = float(depth["gemm_k_half"]) if depth is not None else 0.0
        k_ref = float(mb["gemm_sweep"]["k"])
        changes["gemm_k_half"] = kh
        if depth is None:
            sources["gemm_k_half"] = f"0: the row sweep (at K = {k_ref:.0f}) stands for every depth"
        else:
            sources["gemm_k_half"] = "measured: the depth sweep's fit rate x K / (K + k_half)"
            for kind in ("gemm", "moe"):
                changes[f"{kind}_efficiency_max"] = fit["gemm_efficiency_max"] * (k_ref + kh) / k_ref
                sources[f"{kind}_efficiency_max"] = (f"fitted to the GEMM row sweep (at K = {k_ref:.0f}), over the "
                                                     f"depth factor there, K / (K + k_half)")
    sources["others"] = "serving config"
    return dataclasses.replace(base, **changes), sources


