"""``python -m codesign.execute workload=NAME [layers=2] [batch=[1,8]] [context=512]``: run on the real device.

Runs the workload's own JAX model code (``serving.models.build_model``) on the local JAX device (the CPU, or a
GPU / TPU when one is present) with random weights (:func:`random_params`), at a reduced depth (the first
``layers`` decoder layers) and the model's real widths (hidden size, heads, FFN and expert widths; ``vocab=`` caps
the vocabulary, ``experts=`` the routed experts, which are also capped, with a note, when the model would not fit
the device's memory), and compares what it measures with what the kernel-level serving model (``serving/perf.py``)
predicts for the same steps:

- **measured**: one decode step per batch size B at context C (a KV cache of C filled positions, its length reset
  every step) and one prefill of T tokens, each ``jax.jit``-compiled, run ``warmup`` times, then timed ``repeats``
  times with ``block_until_ready``; the median is reported (``stat=min``: the fastest run, for every timing
  including the micro-benchmarks, the steadier figure on a machine that other jobs share). The KV cache is donated
  to the step (updated in place, as a serving engine does; XLA would otherwise copy the whole cache every step).
  With ``kernels=true`` every kernel of the step (the named scopes of ``serving/models/__init__.py``:
  ``layer_0/qkv_proj``, ``layer_0/attention``, ...) is also timed on its own: the step's jaxpr is cut into runs of
  equations of one kernel (:func:`time_kernels`), and each run is jitted and timed on the step's own intermediate
  values (so routing, masks and cache contents are the step's), a written cache again donated;
- **predicted**: the same reduced-depth architecture (``dataclasses.replace`` on the preset's), its kernel table
  (``serving.kernel_table.build_kernel_table``) in the precision of the execution dtype (``fp32``: every tensor and
  the KV cache in float32; ``bf16`` for bfloat16), and ``serving.perf.step_time`` on one chip (``Mapping()``) for
  ``Work(decode_tokens=B, decode_queries=1, context=C)`` and ``Work(prefill_requests=1, prefill_len=T)``. Per kernel
  class (GEMMs: the projections, dense FFN, router and lm_head; attention; MoE experts; other: embedding, norms,
  residual adds) the prediction is the sum of that class's ``kernel_times`` (x the kernel counts), the measurement
  the sum of the class's kernels timed alone.

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
- ``phase`` (default): as ``run``, with one curve for the decode steps (fitted to M = 1 .. 2 x the largest batch)
  and one for the prefill (M = T/4 .. T). XLA:CPU needs this: a 1-row product runs as a bandwidth-bound GEMV,
  products of 2-32 rows take a slow small-GEMM path (their time grows like M^0.6, not linearly) and from ~64 rows
  the blocked GEMM approaches the square-matmul rate, which no single curve of the serving model's form follows
  (the ``run`` fit's residuals and ratios show by how much). The fits use synthetic matrices, never the model's.

The attention curve (``attention_rows_half``) and the memory ramp (``memory_bytes_half``) stay as configured in
every mode: they are the serving model's claims under test.

MoE experts (``moe_impl``): the model code multiplies the routed experts with ``jax.lax.ragged_dot``. On XLA:CPU
(JAX 0.10) that primitive is lowered to a dense matmul over *all* E experts with a masked [E, rows, h] left operand,
i.e. E times the FLOPs and every expert's weights read for every row; the serving model (like vLLM / MegaBlocks
fused-MoE kernels) assumes a grouped GEMM over the touched experts. ``moe_impl=grouped`` (default) runs the same
model code with ``jax.lax.ragged_dot`` replaced, for the executed steps only, by :func:`grouped_ragged_dot`, which
multiplies each expert's rows by that expert's matrix tile by tile inside a ``while`` loop (same results; the
kernel table is always traced from the unmodified model). XLA:CPU copies each dynamically indexed expert matrix
before its dot, so the grouped kernel streams a touched expert at about half the GEMV rate (the ``expert-slice``
micro-benchmark line); ``moe_impl=native`` keeps the backend's own lowering.

Output: a table of measured vs predicted time per step and per kernel class (and the ratio predicted / measured),
or one JSON object with ``format=json`` (also per operation, with the predicted compute and memory times).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import platform as _platform
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_quantity
from codesign.cli import CONF_DIR, entry, fail
from codesign.schema import load_workload

PROG = "codesign.execute"
KEYS = ("workload", "serving", "hf_config", "layers", "vocab", "experts", "batch", "context", "prefill_tokens",
        "repeats", "warmup", "stat", "exec_dtype", "moe_impl", "params", "kernels", "format", "seed", "bench")
BENCH_KEYS = ("matmul_size", "stream_bytes", "repeats")
EXEC_DTYPES = ("auto", "float32", "bfloat16")
PRECISION_OF = {"float32": "fp32", "bfloat16": "bf16"}
# (JSON key, table label) of the kernel classes, in the order of serving.kernel_table's KIND_* codes
CLASSES = (("gemm", "GEMMs"), ("attention", "attention"), ("moe_experts", "MoE experts"), ("other", "other"))
MEMORY_HEADROOM = 0.75  # share of the device's free memory the reduced model may plan to use


# ================================================================================================= configuration
@dataclasses.dataclass(frozen=True)
class Plan:
    arch: object  # the reduced-depth architecture (before any expert cap for memory)
    full_arch: object
    params: object  # ServingParams as configured
    notes: tuple
    batches: tuple
    context: int
    prefill_tokens: int
    repeats: int
    warmup: int
    exec_dtype: str
    moe_impl: str
    params_mode: str
    kernels: bool
    format: str
    seed: int
    experts_set: bool
    bench: dict
    stat: str = "median"


def _int(cfg, key, *, allow_zero=False, optional=False):
    return check_quantity(cfg.get(key), key, integer=True, allow_zero=allow_zero, optional=optional)


def reduce_arch(arch, layers: int, vocab: int | None = None, experts: int | None = None):
    """``arch`` cut to its first ``layers`` decoder layers (vocabulary / routed experts capped when given), without
    the MTP head and vision tower (the measured steps do not run them). Returns (architecture, notes)."""
    notes = []
    changes: dict = {"num_layers": layers}
    if arch.num_mtp_layers:
        changes["num_mtp_layers"] = 0
        notes.append("MTP head left out (decode and prefill steps do not run it)")
    if arch.vision is not None:
        changes["vision"] = None
        notes.append("vision tower left out (text steps only)")
    if vocab is not None:
        changes["vocab_size"] = vocab
    if experts is not None:
        changes["num_experts"] = experts
    if arch.num_experts:
        first = arch.first_k_dense_layers
        if not any(i >= first and (i + 1) % arch.moe_layer_step == 0 for i in range(layers)):
            moe_at = [i for i in range(layers) if (i + 1) % arch.moe_layer_step == 0]
            if not moe_at:
                raise ConfigError("layers", f"{arch.name} has an MoE layer every {arch.moe_layer_step} layers: "
                                            f"{layers} layers hold none, use at least {arch.moe_layer_step}")
            changes["first_k_dense_layers"] = moe_at[-1]
            notes.append(f"first_k_dense_layers {first} -> {moe_at[-1]} so that the {layers} layers include an "
                         f"MoE layer")
    try:
        return dataclasses.replace(arch, **changes), notes
    except ConfigError as err:
        key = {"num_experts": "experts", "experts_per_token": "experts", "vocab_size": "vocab"}.get(err.path)
        raise ConfigError(key or f"workload.{err.path}", err.detail) from None


def _validate(cfg: dict, overridden=()) -> Plan:
    from serving.perf import ServingParams

    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    arch = load_workload(cfg)
    params = ServingParams.from_dict(cfg["serving"], "serving")
    layers = _int(cfg, "layers")
    if layers > arch.num_layers:
        raise ConfigError("layers", f"{arch.name} has {arch.num_layers} layers, got {layers}")
    vocab = _int(cfg, "vocab", optional=True)
    if vocab is not None and vocab > arch.vocab_size:
        raise ConfigError("vocab", f"caps the vocabulary: at most {arch.vocab_size} for {arch.name}, got {vocab}")
    experts = _int(cfg, "experts", optional=True)
    if experts is not None:
        if not arch.num_experts:
            raise ConfigError("experts", f"{arch.name} has no routed experts, got {experts}")
        if not arch.experts_per_token <= experts <= arch.num_experts:
            raise ConfigError("experts", f"must be between experts_per_token ({arch.experts_per_token}) and "
                                         f"{arch.num_experts}, got {experts}")
    reduced, notes = reduce_arch(arch, layers, vocab, experts)
    batch = cfg["batch"]
    batches = batch if isinstance(batch, (list, tuple)) else [batch]
    if not batches:
        raise ConfigError("batch", "needs at least one batch size")
    batches = tuple(check_quantity(b, f"batch[{i}]" if isinstance(batch, (list, tuple)) else "batch", integer=True)
                    for i, b in enumerate(batches))
    context = _int(cfg, "context")
    prefill = _int(cfg, "prefill_tokens")
    repeats = _int(cfg, "repeats")
    warmup = _int(cfg, "warmup", allow_zero=True)
    seed = _int(cfg, "seed", allow_zero=True)
    for key, options in (("exec_dtype", EXEC_DTYPES), ("moe_impl", ("grouped", "native")),
                         ("params", PARAM_MODES), ("format", ("table", "json")), ("stat", STATS)):
        if cfg[key] not in options:
            raise ConfigError(key, f"must be one of {', '.join(options)}, got {cfg[key]!r}")
    if not isinstance(cfg["kernels"], bool):
        raise ConfigError("kernels", f"expected true or false, got {cfg['kernels']!r}")
    bench = cfg["bench"]
    if not isinstance(bench, dict):
        raise ConfigError("bench", f"expected a mapping, got {bench!r}")
    for k in bench:
        if k not in BENCH_KEYS:
            raise ConfigError(f"bench.{k}", f"unknown key (known: {', '.join(BENCH_KEYS)})")
    bench = {"matmul_size": check_quantity(bench.get("matmul_size"), "bench.matmul_size", integer=True,
                                           optional=True),
             "stream_bytes": check_quantity(bench.get("stream_bytes"), "bench.stream_bytes", integer=True,
                                            optional=True),
             "repeats": check_quantity(bench.get("repeats", 5), "bench.repeats", integer=True),
             "stat": cfg["stat"]}
    return Plan(arch=reduced, full_arch=arch, params=params, notes=tuple(notes), batches=batches, context=context,
                prefill_tokens=prefill, repeats=repeats, warmup=warmup, exec_dtype=cfg["exec_dtype"],
                moe_impl=cfg["moe_impl"], params_mode=cfg["params"], kernels=cfg["kernels"], format=cfg["format"],
                seed=seed, experts_set=experts is not None, bench=bench, stat=cfg["stat"])


# ================================================================================================= the device
def device_info() -> dict:
    """Platform, kind, cores, memory and last-level cache of the default JAX device."""
    import jax

    dev = jax.devices()[0]
    info = {"platform": dev.platform, "device_kind": dev.device_kind, "devices": jax.device_count(),
            "jax": jax.__version__}
    if dev.platform == "cpu":
        info["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        info["processor"] = _cpu_model() or _platform.processor() or "unknown CPU"
        mem = _meminfo()
        info["memory_bytes"] = mem.get("MemTotal", 0.0)
        info["free_memory_bytes"] = mem.get("MemAvailable", mem.get("MemTotal", 0.0))
        info["cache_bytes"], info["cache_source"] = _llc_bytes()
    else:
        stats = {}
        try:
            stats = dev.memory_stats() or {}
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            pass
        limit = float(stats.get("bytes_limit", 0.0))
        info["memory_bytes"] = limit
        info["free_memory_bytes"] = limit - float(stats.get("bytes_in_use", 0.0))
        info["cache_bytes"], info["cache_source"] = 50.0 * 2 ** 20, "assumed: 50 MiB (an H100/H200-class L2)"
        info["processor"] = dev.device_kind
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _meminfo() -> dict:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, rest = line.split(":", 1)
            out[key] = float(rest.split()[0]) * 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return out


def _llc_bytes() -> tuple[float, str]:
    best = (0, 0.0)
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in base.glob("index*"):
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
            mult = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(size[-1], 1)
            value = float(size.rstrip("KMG")) * mult
            if kind in ("Unified", "Data") and (level, value) > best:
                best = (level, value)
    except (OSError, ValueError):
        pass
    if best[1] > 0:
        return best[1], f"sysfs: L{best[0]} cache of cpu0, {best[1] / 2 ** 20:.0f} MiB"
    return 32.0 * 2 ** 20, "assumed: 32 MiB last-level cache (sysfs reported none)"


def _samples(fn, args, repeats: int, warmup: int = 1, fresh=None) -> np.ndarray:
    """Wall times of ``repeats`` runs of ``fn(*args)`` (each blocked until ready), after one compiling run and
    ``warmup`` more. ``fresh(args) -> args`` prepares each run's arguments outside the timed region (donated
    buffers)."""
    import jax

    def once():
        a = fresh(args) if fresh else args
        if fresh:
            jax.block_until_ready(a)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*a))
        return time.perf_counter() - t0

    once()
    for _ in range(warmup):
        once()
    return np.asarray([once() for _ in range(repeats)])


STATS = ("median", "min")


def _stat(samples, stat: str) -> float:
    return float(np.median(samples) if stat == "median" else np.min(samples))


def _timed(fn, args, repeats: int, warmup: int = 1, fresh=None, stat: str = "median") -> float:
    return _stat(_samples(fn, args, repeats, warmup, fresh), stat)


def _interleaved(calls, repeats: int, warmup: int = 1, stat: str = "median") -> list[float]:
    """Times of several ``(fn, args)`` measured in rounds (each compiled and warmed first, then one run of each
    per round): a slow spell of a shared machine then lands on every call alike instead of on whichever call
    happened to run during it, which matters when the calls are compared with one another (the GEMM row sweep
    against the streaming bandwidth)."""
    import jax

    for fn, args in calls:
        for _ in range(1 + warmup):
            jax.block_until_ready(fn(*args))
    samples = [[] for _ in calls]
    for _ in range(repeats):
        for i, (fn, args) in enumerate(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[i].append(time.perf_counter() - t0)
    return [_stat(np.asarray(x), stat) for x in samples]


def sweep_rows(batches, prefill_tokens) -> list[int]:
    """Row counts of the GEMM sweep: powers of two up to the largest of the run, and the run's own counts."""
    top = max(max(batches), prefill_tokens)
    rows = {1 << i for i in range(int(np.log2(top)) + 1)} | set(batches) | {prefill_tokens}
    return sorted(rows)


def microbenchmarks(dtype_name: str, info: dict, bench: dict, rows=(1,), experts: bool = False) -> dict:
    """The device in the execution dtype: achieved square-matmul FLOP/s, GEMV weight-streaming bandwidth (and a
    reduction's, for reference), in-cache GEMV bandwidth, dispatch of a jitted call, the cost of one more small
    kernel inside a jitted program, a GEMM row sweep ``x[M, K] @ W[K, N]`` over ``rows`` and, with ``experts``,
    the streaming rate of GEMVs on dynamically indexed slices of a stacked weight (what the grouped MoE kernel
    does; reported, not used by the prediction)."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype_name)
    item = dtype.itemsize
    cpu = info["platform"] == "cpu"
    reps, st = bench["repeats"], bench.get("stat", "median")
    out = {}
    n = bench["matmul_size"] or (2048 if cpu else 8192)
    a = jnp.full((n, n), 0.5, dtype)
    b = jnp.full((n, n), 0.25, dtype)
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(dtype))
    out["matmul_flops_per_s"] = 2.0 * n ** 3 / _timed(mm, (a, b), reps, stat=st)
    out["matmul_shape"] = f"{n}x{n} @ {n}x{n} {dtype_name}"
    del a, b
    gemv = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    k = 8192
    stream = bench["stream_bytes"] or (2 ** 30 if cpu else 2 ** 32)
    cols = max(stream // (k * item), 8)
    w_stream = jnp.full((k, cols), 0.5, dtype)
    x = jnp.full((1, k), 0.5, dtype)
    out["stream_shape"] = f"1x{k} @ {k}x{cols} {dtype_name}"
    red = jax.jit(lambda w: jnp.sum(w, dtype=jnp.float32))
    out["reduce_bytes_per_s"] = w_stream.nbytes / _timed(red, (w_stream,), reps, stat=st)
    small_cols = max(int(info["cache_bytes"] / 4) // (k * item), 8)
    w = jnp.full((k, small_cols), 0.5, dtype)
    out["cache_bytes_per_s"] = w.nbytes / _timed(gemv, (x, w), max(reps, 10), stat=st)
    out["cache_shape"] = f"1x{k} @ {k}x{small_cols} {dtype_name} ({w.nbytes / 2 ** 20:.0f} MiB)"
    del w
    one = jnp.ones((), jnp.float32)
    # overheads: the minimum of many runs (microseconds, where the median of a shared machine is mostly noise)
    out["dispatch_s"] = float(_samples(jax.jit(lambda v: v + 1.0), (one,), 100, warmup=10).min())

    def chain(length):
        def f(x, m):
            for _ in range(length):
                x = jnp.dot(x, m)
            return x
        return jax.jit(f)

    xs, ms = jnp.full((16, 16), 0.01, dtype), jnp.full((16, 16), 0.01, dtype)
    t1 = _samples(chain(1), (xs, ms), 100, warmup=10).min()
    t257 = _samples(chain(257), (xs, ms), 100, warmup=10).min()
    out["kernel_overhead_s"] = float(max((t257 - t1) / 256.0, 0.0))
    # GEMM row sweep over a weight of half the streaming benchmark's bytes (beyond the caches, as the model's are),
    # interleaved with the streaming GEMV: the decode fit splits each point's time into memory (at the streaming
    # rate) and compute, so both must see the machine in the same state
    kk = 4096
    nn = max(stream // 2 // (kk * item), 8)
    w = jnp.full((kk, nn), 0.5, dtype)
    calls = [(gemv, (x, w_stream))] + [(gemv, (jnp.full((int(m), kk), 0.5, dtype), w)) for m in rows]
    times = _interleaved(calls, max(reps, 5), stat=st)
    out["stream_bytes_per_s"] = w_stream.nbytes / times[0]
    out["gemm_sweep"] = {"k": kk, "n": nn, "dtype": dtype_name, "rows": [int(m) for m in rows],
                         "seconds": times[1:]}
    del w, w_stream, calls
    if experts:  # 8 of 16 stacked [4096, n] matrices, picked by traced indices inside one jitted loop
        ne = max(stream // 2 // (16 * kk * item), 8)
        stack = jnp.full((16, kk, ne), 0.5, dtype)
        ids = jnp.arange(0, 16, 2, dtype=jnp.int32)
        xe = jnp.full((1, kk), 0.5, dtype)

        def picked(x, w, ids):
            def body(i, acc):
                we = jax.lax.dynamic_index_in_dim(w, ids[i], 0, keepdims=False)
                return acc + jnp.dot(x, we, preferred_element_type=jnp.float32)
            return jax.lax.fori_loop(0, 8, body, jnp.zeros((1, w.shape[2]), jnp.float32))

        t = _timed(jax.jit(picked), (xe, stack, ids), reps, stat=st)
        out["expert_slice_bytes_per_s"] = 8 * kk * ne * item / t
        out["expert_slice_shape"] = f"1x{kk} @ [16, {kk}, {ne}][e] {dtype_name}, 8 experts"
        del stack
    return out


def fit_gemm_curve(mb: dict, base, lo: float = 0, hi: float = float("inf")) -> dict:
    """Fit the serving model's GEMM efficiency curve e_max x rows / (rows + rows_half) to the row sweep's points
    with ``lo <= rows <= hi``: the kernel time ``max(FLOPs / (rate x eff), bytes / bandwidth x (1 +
    memory_bytes_half / bytes)) + kernel_overhead`` (serving.perf.kernel_times with the device chip, memory
    efficiency 1), least squares of log time, e_max in (0, 1], rows_half >= 0. Returns the fit and its
    predicted / measured time per row count."""
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
    i, j = np.unravel_index(np.argmin(err), err.shape)
    best = model[i, j]
    return {"gemm_efficiency_max": float(e[i, 0, 0]), "gemm_rows_half": float(h[0, j, 0]),
            "predicted_over_measured": [float(v) for v in best / meas], "rows": [int(r) for r in rows]}


def phase_rows(batches, prefill_tokens) -> dict:
    """The sweep's row range of each fit: decode (1 .. twice the largest batch, at least 4), prefill (a quarter of
    the prefill tokens .. the prefill tokens), run (everything)."""
    return {"decode": (1, max(2 * max(batches), 4)), "prefill": (prefill_tokens / 4, prefill_tokens),
            "run": (0, float("inf"))}


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
MODE_TEXT = {"phase": "efficiency maxima 1, GEMM/MoE curve fitted to the sweep's rows of each phase, overheads "
                      "measured, the rest from the serving config",
             "run": "efficiency maxima 1, one GEMM/MoE curve fitted to the whole sweep, overheads measured, the "
                    "rest from the serving config",
             "rates": "efficiency maxima 1, overheads measured, the rest from the serving config",
             "config": "the serving config as is"}


def device_params(base, mb: dict, mode: str, fit: dict | None = None):
    """ServingParams for the device chip and where each replaced value came from (module docstring); ``fit``: the
    GEMM curve of modes ``phase`` and ``run``."""
    if mode == "config":
        return base, {"all": "serving config, as is"}
    changes = {"gemm_efficiency_max": 1.0, "attention_efficiency_max": 1.0, "moe_efficiency_max": 1.0,
               "memory_efficiency_max": 1.0, "kernel_overhead_s": mb["kernel_overhead_s"],
               "step_overhead_s": mb["dispatch_s"]}
    sources = {k: "1: the chip's rates are achieved rates" for k in changes if k.endswith("_max")}
    sources["kernel_overhead_s"] = "measured: one more small dot inside a jitted program"
    sources["step_overhead_s"] = "measured: dispatch of a trivial jitted call"
    if mode in ("phase", "run") and fit is not None:
        for kind in ("gemm", "moe"):
            changes[f"{kind}_efficiency_max"] = fit["gemm_efficiency_max"]
            changes[f"{kind}_rows_half"] = fit["gemm_rows_half"]
            for f in ("efficiency_max", "rows_half"):
                sources[f"{kind}_{f}"] = "fitted to the GEMM row sweep (the grouped MoE kernel runs the same dots)"
    sources["others"] = "serving config"
    return dataclasses.replace(base, **changes), sources


# ================================================================================================= MoE kernel
def grouped_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """``jax.lax.ragged_dot`` as a grouped GEMM: rows ``[lhs.shape[0], K]`` sorted by group, ``rhs [G, K, N]``,
    ``group_sizes [G]``. The rows of each group are multiplied by that group's matrix in tiles of ``tile`` rows (a
    ``while`` loop over the non-empty tiles only), so only the touched experts' weights are read and the FLOPs are
    those of the rows (plus the padding of each group's last tile). ``tile`` is 1 when there are no more rows than
    groups (decode: a GEMV per row), else the power of two nearest below rows / groups, at most 64."""
    import jax
    import jax.numpy as jnp

    if group_offset is not None:
        raise NotImplementedError("grouped_ragged_dot: group_offset is not supported")
    m, k = lhs.shape
    g, _, n = rhs.shape
    out_dtype = jnp.dtype(preferred_element_type) if preferred_element_type is not None \
        else jnp.result_type(lhs, rhs)
    tile = 1 if m <= g else int(min(64, 2 ** int(np.floor(np.log2(m / g)))))
    gs = group_sizes.astype(jnp.int32)
    tiles = (gs + tile - 1) // tile
    tile_end = jnp.cumsum(tiles)
    tile_start = tile_end - tiles
    row_start = jnp.cumsum(gs) - gs
    lhs_p = jnp.concatenate([lhs, jnp.zeros((tile, k), lhs.dtype)])
    lanes = jnp.arange(tile)[:, None]

    def body(j, out):
        e = jnp.searchsorted(tile_end, j, side="right").astype(jnp.int32)
        t = j - tile_start[e]
        r0 = row_start[e] + t * tile
        x = jax.lax.dynamic_slice(lhs_p, (r0, 0), (tile, k))
        w = jax.lax.dynamic_index_in_dim(rhs, e, 0, keepdims=False)
        y = jnp.dot(x, w, precision=precision, preferred_element_type=out_dtype)
        old = jax.lax.dynamic_slice(out, (r0, 0), (tile, n))
        return jax.lax.dynamic_update_slice(out, jnp.where(lanes < gs[e] - t * tile, y, old), (r0, 0))

    out = jax.lax.fori_loop(0, tile_end[-1], body, jnp.zeros((m + tile, n), out_dtype))
    return out[:m]


@contextlib.contextmanager
def moe_kernel(impl: str):
    """Within the block, the model code's ``jax.lax.ragged_dot`` is ``impl``'s (``native``: unchanged)."""
    import jax

    if impl == "native":
        yield
        return
    saved = jax.lax.ragged_dot
    jax.lax.ragged_dot = grouped_ragged_dot
    try:
        yield
    finally:
        jax.lax.ragged_dot = saved


# ================================================================================================= fitting in memory
def _tree_bytes(tree) -> float:
    import jax

    return float(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _footprint(arch, dtype, batches, context, prefill) -> tuple[float, float]:
    """(parameter bytes, peak bytes of the largest step) of ``arch`` executed in ``dtype``."""
    import jax

    from serving.models import build_model

    model = build_model(arch)
    p = _tree_bytes(jax.eval_shape(functools.partial(model.init, dtype=dtype), jax.random.key(0)))
    kv = max(_tree_bytes(jax.eval_shape(functools.partial(model.init_cache, max(batches), context + 1, dtype))),
             _tree_bytes(jax.eval_shape(functools.partial(model.init_cache, 1, prefill, dtype))))
    width = max(arch.hidden_size, arch.intermediate_size or 0,
                (arch.expert_intermediate_size or 0) * max(arch.experts_per_token, 1))
    # float32 logits: one row per decoding sequence, one per prompt (prefill samples from its last position)
    act = 4.0 * (max(max(batches), 1) * arch.vocab_size + 2 * arch.num_attention_heads * prefill ** 2
                 + 8 * prefill * width)
    return p, p + 3 * kv + act  # the cache: the step's, the segment timing's copy, its output


def fit_device(plan: Plan, dtype, free_bytes: float):
    """The architecture to execute: ``plan.arch``, with its routed experts capped when the parameters would not
    fit ``MEMORY_HEADROOM`` x the free device memory. Returns (arch, notes)."""
    arch = plan.arch
    budget = MEMORY_HEADROOM * free_bytes
    p, need = _footprint(arch, dtype, plan.batches, plan.context, plan.prefill_tokens)
    if need <= budget or free_bytes <= 0:
        return arch, []
    gib = 2.0 ** 30
    if arch.num_experts and not plan.experts_set:
        k = arch.experts_per_token
        group = arch.n_group if arch.router == "sigmoid_grouped" and arch.n_group else 1
        low = max(k, group)
        low = -(-low // group) * group
        small = dataclasses.replace(arch, num_experts=low)
        p_low, need_low = _footprint(small, dtype, plan.batches, plan.context, plan.prefill_tokens)
        per_expert = (p - p_low) / (arch.num_experts - low) if arch.num_experts > low else 0.0
        if need_low <= budget and per_expert > 0:
            e = int(low + (budget - need_low) // per_expert)
            e = max(low, min(arch.num_experts - 1, e // group * group))
            try:
                capped = dataclasses.replace(arch, num_experts=e)
            except ConfigError as err:
                raise ConfigError("experts", f"cannot cap {arch.name}'s experts to fit: {err}") from None
            return capped, [f"routed experts capped {arch.num_experts} -> {e} per MoE layer to fit "
                            f"{MEMORY_HEADROOM:.0%} of the device's {free_bytes / gib:.1f} GiB free memory "
                            f"(prediction and measurement both use {e})"]
    raise ConfigError("layers", f"{arch.name} at {arch.num_layers} layers needs ~{need / gib:.1f} GiB "
                                f"({p / gib:.1f} GiB of weights), the device has {free_bytes / gib:.1f} GiB free: "
                                f"lower layers=, vocab= or experts=")


# ================================================================================================= measurement
def _kernel_class(name: str) -> int:
    from serving.graph import KERNEL_KINDS
    from serving.kernel_table import _KIND, KIND_VECTOR

    op = name.rsplit("/", 1)[-1]
    kind = "norm" if op.endswith("norm") else KERNEL_KINDS.get(op, "other")
    return _KIND.get(kind, KIND_VECTOR)


def _runs(closed):
    """The step's top-level equations cut into maximal runs of one kernel: [(kernel name, jaxpr, in vars, out
    vars, donatable (input index, output index) pairs)]."""
    import jax.extend.core as jcore

    from serving.graph import _kernel_of

    jaxpr = closed.jaxpr
    names = [_kernel_of(str(e.source_info.name_stack))[0] for e in jaxpr.eqns]
    spans, start = [], 0
    for i in range(1, len(names) + 1):
        if i == len(names) or names[i] != names[start]:
            spans.append((names[start], start, i))
            start = i
    run_of = {}
    for r, (_, a, b) in enumerate(spans):
        for e in jaxpr.eqns[a:b]:
            for v in e.outvars:
                if not isinstance(v, jcore.DropVar):
                    run_of[v] = r
    needed = [set() for _ in spans]  # vars of run r used by a later run or returned
    for r, (_, a, b) in enumerate(spans):
        for e in jaxpr.eqns[a:b]:
            for v in e.invars:
                if not isinstance(v, jcore.Literal) and run_of.get(v, r) != r:
                    needed[run_of[v]].add(v)
    for v in jaxpr.outvars:
        if not isinstance(v, jcore.Literal) and v in run_of:
            needed[run_of[v]].add(v)
    out = []
    for r, (name, a, b) in enumerate(spans):
        eqns = jaxpr.eqns[a:b]
        ins, seen, defined = [], set(), set()
        for e in eqns:
            for v in e.invars:
                if not isinstance(v, jcore.Literal) and v not in defined and v not in seen:
                    seen.add(v)
                    ins.append(v)
            defined.update(v for v in e.outvars if not isinstance(v, jcore.DropVar))
        outs = [v for e in eqns for v in e.outvars if v in needed[r]]
        if not outs:
            outs = [v for v in eqns[-1].outvars if not isinstance(v, jcore.DropVar)]
        pairs = []
        for e in eqns:  # a cache written in place: donate the input buffer, as the step does
            if e.primitive.name == "dynamic_update_slice" and e.invars[0] in ins and e.outvars[0] in outs:
                pairs.append((ins.index(e.invars[0]), outs.index(e.outvars[0])))
        effects = frozenset().union(*(e.effects for e in eqns))
        sub = jcore.Jaxpr(constvars=[], invars=ins, outvars=outs, eqns=eqns, effects=effects)
        out.append((name, sub, ins, outs, pairs))
    return out


def time_kernels(fn, args, repeats: int, warmup: int, stat: str = "median") -> dict:
    """Every kernel of the step ``fn(*args)`` jitted and timed on its own, on the step's own intermediate values:
    {kernel name: seconds} (a kernel cut into several runs sums them)."""
    import jax
    import jax.numpy as jnp

    with jax.disable_jit():  # inline the models' jitted decoder blocks: kernels are cut from one flat jaxpr
        closed = jax.make_jaxpr(fn)(*args)
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, jax.tree.leaves(args)))
    times: dict = {}
    for name, sub, ins, outs, pairs in _runs(closed):
        run = functools.partial(jax.core.eval_jaxpr, sub, [])
        donate = tuple(sorted({i for i, _ in pairs}))
        jitted = jax.jit(run, donate_argnums=donate)
        vals = [env[v] for v in ins]
        copies = (lambda a: [jnp.copy(x) if i in donate else x for i, x in enumerate(a)]) if donate else None
        first = jitted(*(copies(vals) if copies else vals))
        env.update(zip(outs, first))
        times[name] = times.get(name, 0.0) + _timed(jitted, vals, repeats, warmup, fresh=copies, stat=stat)
        del first
    return times


POOL = 1 << 24  # random values every weight leaf is cut from (64 MiB of float32)


def random_params(model, key, dtype):
    """Random weights in the tree ``model.init`` builds: N(0, 0.02^2) values (the GQA models' own recipe), norm
    weights 1. Each leaf is a window at a random offset into one pool of ``POOL`` draws, tiled to the leaf's size
    (leaves smaller than the pool, such as routers, biases and sinks, are distinct draws). Drawing billions of
    normals takes minutes on a CPU and the models' one-computation ``init`` needs two to three times the weights
    in memory at full width (gpt-oss-20b's two layers in float32, 10 GiB of weights, did not initialise in 23 GiB);
    the values do not change the timing."""
    import jax
    import jax.numpy as jnp

    k_pool, k_off = jax.random.split(key)
    pool = 0.02 * jax.random.normal(k_pool, (POOL,), jnp.float32)
    shapes = jax.eval_shape(functools.partial(model.init, dtype=dtype), key)
    paths, tree = jax.tree_util.tree_flatten_with_path(shapes)
    offsets = np.asarray(jax.random.randint(k_off, (len(paths),), 0, POOL))

    @functools.partial(jax.jit, static_argnums=(2, 3))
    def window(pool, off, shape, dt):
        size = math.prod(shape)
        reps = -(-size // POOL)
        return jnp.tile(jnp.roll(pool, -off), reps)[:size].reshape(shape).astype(dt)

    out = []
    for off, (path, leaf) in zip(offsets, paths):
        last = str(getattr(path[-1], "key", getattr(path[-1], "idx", "")))
        if last.endswith("norm"):
            out.append(jnp.ones(leaf.shape, leaf.dtype))
        else:
            out.append(window(pool, jnp.int32(off), tuple(leaf.shape), jnp.dtype(leaf.dtype)))
        jax.block_until_ready(out[-1])
    return jax.tree.unflatten(tree, out)


def _random_cache(cache, key, dtype):
    import jax

    leaves, tree = jax.tree.flatten(cache)
    keys = jax.random.split(key, len(leaves))
    new = [jax.random.normal(k, x.shape, jax.numpy.float32).astype(dtype)
           if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(tree, new)


def _buffers(cache):
    """(float leaves, other leaves, treedef) of a cache: the KV buffers (donated) and the rest (its length)."""
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(cache)
    bufs = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    rest = [x for x in leaves if not jnp.issubdtype(x.dtype, jnp.floating)]
    return bufs, rest, tree


def _donating(step_fn, cache):
    """``step_fn(params, tokens, cache)`` jitted with the cache's KV buffers donated (updated in place) and its
    other leaves (the length) passed as they are: (jitted(params, tokens, bufs, rest), bufs, rest, rebuild)."""
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(cache)
    is_buf = [bool(jnp.issubdtype(x.dtype, jnp.floating)) for x in leaves]
    bufs, rest, _ = _buffers(cache)

    def rebuild(b, r=rest):
        it_b, it_r = iter(b), iter(r)
        return jax.tree.unflatten(tree, [next(it_b) if f else next(it_r) for f in is_buf])

    jitted = jax.jit(lambda p, t, b, r: step_fn(p, t, rebuild(b, r)), donate_argnums=(2,))
    return jitted, bufs, rest, rebuild


def measure_decode(model, params, batch: int, context: int, dtype, plan: Plan, key) -> dict:
    """One decode step of ``batch`` sequences at ``context`` (the cache's filled length, reset every step so every
    timed step attends over the same context), KV cache donated. Optionally every kernel alone."""
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(key)
    cache = _random_cache(model.init_cache(batch, context + 1, dtype), k1, dtype)
    length = jnp.asarray(context, jnp.int32)
    cache = dict(cache, length=length)
    tokens = jax.random.randint(k2, (batch, 1), 0, model.arch.vocab_size, jnp.int32)
    step, bufs, rest, rebuild = _donating(model.decode, cache)
    state = {"bufs": bufs}

    def once():
        logits, new = step(params, tokens, state["bufs"], rest)
        state["bufs"] = _buffers(new)[0]  # the updated cache, its length kept at ``context``
        return logits, state["bufs"]

    t = _samples(lambda: once(), (), plan.repeats, plan.warmup)
    out = {"phase": "decode", "batch": batch, "context": context, "measured_s": _stat(t, plan.stat),
           "measured_median_s": float(np.median(t)), "measured_min_s": float(t.min())}
    if plan.kernels:
        out["kernels_measured_s"] = time_kernels(model.decode, (params, tokens, rebuild(state["bufs"])),
                                                 plan.repeats, plan.warmup, plan.stat)
    return out


def measure_prefill(model, params, tokens_n: int, dtype, plan: Plan, key) -> dict:
    """One prefill of ``tokens_n`` tokens (one request) into an empty, donated KV cache."""
    import jax
    import jax.numpy as jnp

    cache = model.init_cache(1, tokens_n, dtype)
    tokens = jax.random.randint(key, (1, tokens_n), 0, model.arch.vocab_size, jnp.int32)
    step, bufs, rest, _ = _donating(model.prefill, cache)
    state = {"bufs": bufs}

    def once():
        logits, new = step(params, tokens, state["bufs"], rest)
        state["bufs"] = _buffers(new)[0]
        return logits, state["bufs"]

    t = _samples(lambda: once(), (), plan.repeats, plan.warmup)
    out = {"phase": "prefill", "batch": 1, "tokens": tokens_n, "measured_s": _stat(t, plan.stat),
           "measured_median_s": float(np.median(t)), "measured_min_s": float(t.min())}
    if plan.kernels:
        out["kernels_measured_s"] = time_kernels(model.prefill, (params, tokens, model.init_cache(1, tokens_n, dtype)),
                                                 plan.repeats, plan.warmup, plan.stat)
    return out


# ================================================================================================= prediction
def op_name(kernel: str) -> str:
    """The kernel's operation, as the kernel table names its merged rows; norms and the residual adds (the bare
    ``layer_i`` scope) are pooled, since the table merges identical rows under the first one's name."""
    op = kernel.rsplit("/", 1)[-1]
    if op.endswith("norm"):
        return "norms"
    if op.startswith("layer_") and op[6:].isdigit():
        return "residual"
    return op


def predict_step(chip, kt, sp, work) -> dict:
    """The serving model's step time, per kernel class and per operation (layers summed), with the compute and
    memory times behind each kernel's max."""
    from serving.perf import Mapping, step_time

    total, out = step_time(chip, kt, sp, Mapping(), work)
    count = np.asarray(kt.count)
    t = np.asarray(out["t"]) * count
    tc, tm = np.asarray(out["t_compute"]) * count, np.asarray(out["t_memory"]) * count
    kinds = np.asarray(kt.kind)
    classes = {key: float(t[kinds == i].sum()) for i, (key, _) in enumerate(CLASSES)}
    ops: dict = {}
    for i, name in enumerate(kt.names):
        d = ops.setdefault(op_name(name), {"predicted_s": 0.0, "compute_s": 0.0, "memory_s": 0.0, "count": 0.0})
        d["predicted_s"] += float(t[i])
        d["compute_s"] += float(tc[i])
        d["memory_s"] += float(tm[i])
        d["count"] += float(count[i])
    return {"predicted_s": float(total), "classes_predicted_s": classes, "ops": ops,
            "step_overhead_s": float(sp.step_overhead_s)}


def _merge(measured: dict, predicted: dict, others: dict) -> dict:
    row = dict(measured) | {k: v for k, v in predicted.items() if k != "ops"}
    row["ratio"] = row["predicted_s"] / row["measured_s"]
    row["predicted_s_by_params"] = others
    km = row.pop("kernels_measured_s", None)
    ops = {name: dict(d, measured_s=None) for name, d in predicted["ops"].items()}
    if km is not None:
        classes = dict.fromkeys((k for k, _ in CLASSES), 0.0)
        for d in ops.values():
            d["measured_s"] = 0.0
        for name, sec in km.items():
            classes[CLASSES[_kernel_class(name)][0]] += sec
            d = ops.setdefault(op_name(name), {"predicted_s": 0.0, "compute_s": 0.0, "memory_s": 0.0,
                                               "count": 0.0, "measured_s": 0.0})
            d["measured_s"] += sec
        row["classes_measured_s"] = classes
        row["kernels_alone_s"] = float(sum(km.values()))
    row["ops"] = ops
    return row


# ================================================================================================= the command
def execute(plan: Plan) -> dict:
    import jax
    import jax.numpy as jnp

    from serving.kernel_table import build_kernel_table
    from serving.models import build_model
    from serving.perf import Work
    from serving.precision import Precision

    info = device_info()
    dtype_name = plan.exec_dtype if plan.exec_dtype != "auto" else (
        "float32" if info["platform"] == "cpu" else "bfloat16")
    dtype = jnp.dtype(dtype_name)
    notes = list(plan.notes)
    if dtype_name == "bfloat16" and info["platform"] == "cpu":
        notes.append("bfloat16 on XLA:CPU: matmuls are emulated and slow (exec_dtype=float32 is the CPU choice)")
    arch, fit_notes = fit_device(plan, dtype, info["free_memory_bytes"])
    notes += fit_notes
    mb = microbenchmarks(dtype_name, info, plan.bench, sweep_rows(plan.batches, plan.prefill_tokens),
                         experts=bool(arch.num_experts))
    fits = {name: fit_gemm_curve(mb, plan.params, lo, hi)
            for name, (lo, hi) in phase_rows(plan.batches, plan.prefill_tokens).items()}
    chip = device_chip(info, mb, dtype_name)

    def params_for(mode, phase):
        return device_params(plan.params, mb, mode, fits[phase if mode == "phase" else "run"])
    prec_name = PRECISION_OF[dtype_name]
    precision = Precision.from_dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "precision" /
                                                                          f"{prec_name}.yaml")), "precision")
    kt = build_kernel_table(arch, precision)  # traced from the unmodified model (no moe_kernel patch)
    model = build_model(arch)
    key = jax.random.key(plan.seed)
    params = random_params(model, key, dtype)
    works = [("decode", b, Work(decode_tokens=float(b), decode_queries=1.0, context=float(plan.context),
                                prefill_requests=0.0, prefill_len=0.0)) for b in plan.batches]
    works.append(("prefill", plan.prefill_tokens, Work(decode_tokens=0.0, decode_queries=1.0, context=0.0,
                                                       prefill_requests=1.0, prefill_len=float(plan.prefill_tokens))))
    steps = []
    with moe_kernel(plan.moe_impl if arch.num_experts else "native"):
        for i, (phase, n, work) in enumerate(works):
            sub = jax.random.fold_in(key, 1 + i)
            m = (measure_decode(model, params, n, plan.context, dtype, plan, sub) if phase == "decode"
                 else measure_prefill(model, params, n, dtype, plan, sub))
            others = {mode: predict_step(chip, kt, params_for(mode, phase)[0], work)["predicted_s"]
                      for mode in PARAM_MODES}
            sp, _ = params_for(plan.params_mode, phase)
            row = _merge(m, predict_step(chip, kt, sp, work), others)
            row["serving_params"] = dataclasses.asdict(sp)
            steps.append(row)
    if arch.num_experts and plan.moe_impl == "native" and info["platform"] == "cpu":
        notes.append("moe_impl=native: XLA:CPU lowers ragged_dot to a dense masked matmul over all experts")
    if plan.kernels:
        notes.append("per-kernel times are each kernel jitted alone (one dispatch each, no cross-kernel fusion); "
                     "'kernels alone' is their sum, against the predicted step less its step overhead")
    notes.append("prefill attention: the model code computes the whole masked T x T square; the serving model "
                 "prices the causal half (FlashAttention-style block skipping)")
    return {
        "workload": arch.name, "layers": arch.num_layers, "model_layers": plan.full_arch.num_layers,
        "vocab": arch.vocab_size, "experts": arch.num_experts,
        "layer_kinds": [f"{k.attention}/{k.ffn}" for k in arch.layer_kinds()],
        "exec_dtype": dtype_name, "precision": precision.name,
        "moe_impl": plan.moe_impl if arch.num_experts else None,
        "device": info, "microbenchmarks": mb, "gemm_fits": fits, "chip": chip.to_dict(),
        "serving_params_mode": plan.params_mode, "serving_params_sources": params_for(plan.params_mode, "run")[1],
        "repeats": plan.repeats, "warmup": plan.warmup, "stat": plan.stat,
        "steps": steps, "notes": notes,
    }


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}" if v < 0.01 else f"{v * 1e3:.2f}"


def _label(s: dict) -> str:
    return f"decode B={s['batch']} C={s['context']}" if s["phase"] == "decode" else f"prefill T={s['tokens']}"


def format_table(r: dict) -> str:
    info, mb = r["device"], r["microbenchmarks"]
    count = f"{info['cores']} cores" if info["platform"] == "cpu" else f"{info['devices']} devices"
    lines = [f"{PROG} | {r['workload']}: {r['layers']} of {r['model_layers']} layers "
             f"({', '.join(dict.fromkeys(r['layer_kinds']))}), vocab {r['vocab']}"
             + (f", {r['experts']} experts, moe_impl {r['moe_impl']}" if r["experts"] else "")
             + f" | {info['platform']} ({count}, {info['processor']}) | {r['exec_dtype']} (precision "
               f"{r['precision']})",
             f"device: matmul {mb['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s ({mb['matmul_shape']}) | weight stream "
             f"{mb['stream_bytes_per_s'] / 1e9:.2f} GB/s (GEMV {mb['stream_shape']}; sum-reduce "
             f"{mb['reduce_bytes_per_s'] / 1e9:.2f} GB/s) | cache {r['chip']['sram_capacity_bytes'] / 2 ** 20:.0f} MiB "
             f"at {r['chip']['sram_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s | dispatch {mb['dispatch_s'] * 1e6:.1f} us, "
             f"per kernel {mb['kernel_overhead_s'] * 1e6:.2f} us"]
    if "expert_slice_bytes_per_s" in mb:
        lines.append(f"expert-slice GEMV (the grouped MoE kernel's access): {mb['expert_slice_bytes_per_s'] / 1e9:.2f}"
                     f" GB/s ({mb['expert_slice_shape']}) vs weight stream {mb['stream_bytes_per_s'] / 1e9:.2f} GB/s")
    sw = mb["gemm_sweep"]
    lines.append(f"GEMM row sweep x[M, {sw['k']}] @ [{sw['k']}, {sw['n']}]: M = "
                 + ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in zip(sw["rows"], sw["seconds"])))
    for name, fit in r["gemm_fits"].items():
        ratios = fit["predicted_over_measured"]
        worst = int(np.argmax(np.abs(np.log(ratios))))
        lines.append(f"  curve fitted to M = {fit['rows'][0]}..{fit['rows'][-1]} ({name}): e_max "
                     f"{fit['gemm_efficiency_max']:.2f}, rows_half {fit['gemm_rows_half']:.1f}; fit pred/meas "
                     f"{min(ratios):.2f}..{max(ratios):.2f} (worst at M = {fit['rows'][worst]})")
    lines.append(f"serving params: {r['serving_params_mode']} ({MODE_TEXT[r['serving_params_mode']]}); measured: "
                 f"{r['stat']} of {r['repeats']} runs after {r['warmup']} warm-up")
    head = ("step", "class", "measured ms", "predicted ms", "pred/meas")
    body = []
    for s in r["steps"]:
        body.append((_label(s), "step", _ms(s["measured_s"]), _ms(s["predicted_s"]), f"{s['ratio']:.2f}"))
        cm = s.get("classes_measured_s")
        for key, name in CLASSES:
            p = s["classes_predicted_s"][key]
            m = cm[key] if cm else None
            if p < 1e-5 and not m:
                continue
            body.append(("", name, _ms(m), _ms(p), f"{p / m:.2f}" if m else "-"))
        if cm:
            alone = s["predicted_s"] - s["step_overhead_s"]
            body.append(("", "kernels alone", _ms(s["kernels_alone_s"]), _ms(alone),
                         f"{alone / s['kernels_alone_s']:.2f}"))
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    fmt = lambda row: "  ".join(v.ljust(w) if i < 2 else v.rjust(w)  # noqa: E731
                                for i, (v, w) in enumerate(zip(row, widths)))
    lines += [fmt(head)] + [fmt(row) for row in body]
    for mode in PARAM_MODES:
        if mode != r["serving_params_mode"]:
            ratios = ", ".join(f"{_label(s)} {s['predicted_s_by_params'][mode] / s['measured_s']:.2f}"
                               for s in r["steps"])
            lines.append(f"pred/meas with params={mode}: {ratios}")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="execute")
def _main(cfg: DictConfig) -> None:
    try:
        plan = _validate(OmegaConf.to_container(cfg, resolve=True))
        result = execute(plan)
    except ConfigError as err:
        fail(PROG, err)
    print(json.dumps(result, indent=1, default=float) if plan.format == "json" else format_table(result))


def cli() -> None:
    entry(PROG, "execute", _validate, _main)


if __name__ == "__main__":
    cli()
