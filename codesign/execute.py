"""``python -m codesign.execute workload=NAME [layers=2] [batch=[1,8]] [context=512]``: run on the real device.

Runs the workload's own JAX model code (``serving.models.build_model``) on the local JAX device (the CPU, or a
GPU / TPU when one is present) with random weights (:func:`codesign.device_steps.random_params`), at a reduced
depth (the first ``layers`` decoder layers) and the model's real widths (hidden size, heads, FFN and expert
widths; ``vocab=`` caps the vocabulary, ``experts=`` the routed experts, which are also capped, with a note, when
the model would not fit the device's memory), and compares what it measures with what the kernel-level serving
model (``serving/perf.py``) predicts for the same steps:

- **measured**: one decode step per batch size B at context C (a KV cache of C filled positions, its length reset
  every step) and one prefill of T tokens, each ``jax.jit``-compiled, run ``warmup`` times, then timed ``repeats``
  times with ``block_until_ready``; the median is reported (``stat=min``: the fastest run, for every timing
  including the micro-benchmarks, the steadier figure on a machine that other jobs share). The KV cache is donated
  to the step (updated in place, as a serving engine does; XLA would otherwise copy the whole cache every step).
  With ``kernels=true`` every kernel of the step (the named scopes of ``serving/models/__init__.py``:
  ``layer_0/qkv_proj``, ``layer_0/attention``, ...) is also timed on its own: the step's jaxpr is cut into runs of
  equations of one kernel (:func:`codesign.device_steps.time_kernels`), and each run is jitted and timed on the
  step's own intermediate values (so routing, masks and cache contents are the step's), a written cache again
  donated;
- **predicted**: the same reduced-depth architecture (``dataclasses.replace`` on the preset's), its kernel table
  (``serving.kernel_table.build_kernel_table``) in the precision of the execution dtype (``fp32``: every tensor and
  the KV cache in float32; ``bf16`` for bfloat16), and ``serving.perf.step_time`` on one chip (``Mapping()``) for
  ``Work(decode_tokens=B, decode_queries=1, context=C)`` and ``Work(prefill_requests=1, prefill_len=T)``. Per kernel
  class (GEMMs: the projections, dense FFN, router and lm_head; attention; MoE experts; other: embedding, norms,
  residual adds) the prediction is the sum of that class's ``kernel_times`` (x the kernel counts), the measurement
  the sum of the class's kernels timed alone.

The chip is the device itself, described from micro-benchmarks run in the same process, and the serving
parameters the micro-benchmarks replace are chosen by ``params`` (``phase`` by default): both in
:mod:`codesign.device_bench`. Each step is timed in rounds with the weight-streaming GEMV and the GEMM sweep rows
of its own window (one run of each per round), and its prediction uses the bandwidth and the GEMM curve measured in
those rounds: on a machine whose memory bandwidth changes from one spell to the next (this VM's does, by 1.5x) a
step and the benchmarks that predict it must see the same machine (:mod:`codesign.device_refs`). The steps are run
and timed by :mod:`codesign.device_steps` (random weights, donated KV caches, per-kernel timing, and the grouped MoE
kernel ``moe_impl=grouped`` swaps in on XLA:CPU).

Output: a table of measured vs predicted time per step and per kernel class (and the ratio predicted / measured),
or one JSON object with ``format=json`` (also per operation, with the predicted compute and memory times).
"""

from __future__ import annotations

import dataclasses
import json

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_quantity
from codesign.cli import CONF_DIR, entry, fail
from codesign.device_attention import attention_sweep, fit_attention_curve
from codesign.device_bench import PARAM_MODES, device_chip, device_params, fit_depth_curve, \
    fit_gemm_curve, microbenchmarks, phase_rows, step_key, sweep_rows
from codesign.device_fit import fit_device, reduce_arch
from codesign.device_info import device_info
from codesign.execute_table import CLASSES, format_table
from codesign.device_refs import references, references_bytes
from codesign.device_steps import measure_decode, measure_prefill, moe_kernel, random_params
from codesign.device_timing import STATS
from codesign.schema import load_workload

PROG = "codesign.execute"
KEYS = ("workload", "serving", "hf_config", "layers", "vocab", "experts", "batch", "context", "prefill_tokens",
        "repeats", "warmup", "stat", "exec_dtype", "moe_impl", "params", "kernels", "format", "seed", "bench")
BENCH_KEYS = ("matmul_size", "stream_bytes", "repeats")
EXEC_DTYPES = ("auto", "float32", "bfloat16")
PRECISION_OF = {"float32": "fp32", "bfloat16": "bf16"}


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
    for key, options in (("exec_dtype", EXEC_DTYPES), ("moe_impl", ("auto", "grouped", "native")),
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


# ================================================================================================= prediction
def _kernel_class(name: str) -> int:
    from serving.graph import kernel_kind
    from serving.kernel_table import _KIND, KIND_VECTOR

    return _KIND.get(kernel_kind(name), KIND_VECTOR)


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
    if info.get("memory_source", "").startswith("unknown"):
        notes.append(f"device memory {info['memory_source']}: the reduced model was not checked against it")
    # the reference GEMV and GEMM sweep stay in memory beside the model: every step is timed in rounds with them
    free = info["free_memory_bytes"]
    arch, fit_notes = fit_device(plan, dtype, free - references_bytes(info, plan.bench) if free > 0 else free)
    notes += fit_notes
    refs = references(dtype_name, info, plan.bench, sweep_rows(plan.batches, plan.prefill_tokens))
    mb = microbenchmarks(dtype_name, info, plan.bench, refs, experts=bool(arch.num_experts))
    windows = phase_rows(plan.batches, plan.prefill_tokens)
    # the whole-run curve from the micro-benchmarks' sweep; each step's own curve from the sweep rows in its window,
    # timed in the same rounds as the step (below)
    fits = {"run": fit_gemm_curve(mb, plan.params, *windows["run"])}
    depth = fit_depth_curve(mb["depth_sweep"])  # the device's own depth term (phase and run modes)
    # the device's attention curve at the largest decode step's shape: reported beside the config's, never used
    att = attention_sweep(dtype, max(plan.batches), plan.context, plan.bench["repeats"],
                          plan.bench.get("stat", "median"))
    att_fit = fit_attention_curve(att, mb["matmul_flops_per_s"], mb["stream_bytes_per_s"])
    chip = device_chip(info, mb, dtype_name)

    def params_for(mode, step, dispatch_s=None):
        # the step's own call overhead (measured with its argument tree) when known, else the scalar call's
        bench = mb if dispatch_s is None else mb | {"dispatch_s": max(dispatch_s, mb["dispatch_s"])}
        return device_params(plan.params, bench, mode, fits[step if mode == "phase" else "run"], depth)
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
    # auto: the grouped loop only where the backend's own ragged_dot is a dense masked matmul (XLA:CPU); on a GPU
    # ragged_dot lowers to a native grouped GEMM, and the loop (a trip count known only at run time) would make the
    # device wait on the host every iteration
    moe_impl = (("grouped" if info["platform"] == "cpu" else "native") if plan.moe_impl == "auto"
                else plan.moe_impl)
    steps = []
    with moe_kernel(moe_impl if arch.num_experts else "native"):
        for i, (phase, n, work) in enumerate(works):
            sub = jax.random.fold_in(key, 1 + i)
            step = step_key(phase, n)
            calls, rows = refs.calls(*windows[step])
            m = (measure_decode(model, params, n, plan.context, dtype, plan, sub, calls) if phase == "decode"
                 else measure_prefill(model, params, n, dtype, plan, sub, calls))
            # the device as it was while the step ran: the streaming bandwidth and the GEMM rates at the step's
            # rows measured in the same rounds as the step (the matmul rate, the caches and the overheads are the
            # micro-benchmarks')
            alongside = mb | refs.bench(m.pop("reference_s"), rows)
            fits[step] = fit_gemm_curve(alongside, plan.params, anchor=n) | {
                "stream_bytes_per_s": alongside["stream_bytes_per_s"]}
            step_chip = device_chip(info, alongside, dtype_name)
            others = {mode: predict_step(step_chip, kt, params_for(mode, step, m["dispatch_s"])[0],
                                         work)["predicted_s"] for mode in PARAM_MODES}
            sp, _ = params_for(plan.params_mode, step, m["dispatch_s"])
            row = _merge(m, predict_step(step_chip, kt, sp, work), others)
            row["serving_params"] = dataclasses.asdict(sp)
            row["stream_bytes_per_s"] = alongside["stream_bytes_per_s"]
            row["gemm_sweep"] = alongside["gemm_sweep"]
            steps.append(row)
    del refs
    if arch.num_experts and moe_impl == "native" and info["platform"] == "cpu":
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
        "moe_impl": moe_impl if arch.num_experts else None,
        "device": info, "microbenchmarks": mb, "gemm_fits": {k: fits[k] for k in [*windows, "run"] if k in fits},
        # the device's own depth curve (phase and run modes predict with it) beside the serving config's
        "depth_fit": depth | {"config_gemm_k_half": float(plan.params.gemm_k_half)},
        "attention_sweep": att,
        "attention_fit": att_fit | {"config_attention_rows_half": float(plan.params.attention_rows_half)},
        "chip": chip.to_dict(),
        "serving_params_mode": plan.params_mode, "serving_params_sources": params_for(plan.params_mode, "run")[1],
        "repeats": plan.repeats, "warmup": plan.warmup, "stat": plan.stat,
        "steps": steps, "notes": notes,
    }


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="execute")
def _main(cfg: DictConfig) -> None:
    try:
        plan = _validate(OmegaConf.to_container(cfg, resolve=True))
        result = execute(plan)
    except ConfigError as err:
        fail(PROG, err)
    print(json.dumps(result, indent=1, default=float) if plan.format == "json" else format_table(result, PROG))


def cli() -> None:
    entry(PROG, "execute", _validate, _main)


if __name__ == "__main__":
    cli()
