"""Which resource pays and where the time goes: a design's sensitivities at matched interactivity, the time of a
prefill and of a decode step split by what binds, and per-kernel roofline points.

Matched interactivity (InferenceX compares chips at equal tok/s/user): on a fixed mapping the interactivity
I(r, B) = 1 / TPOT falls as the concurrency B grows, so a target I* fixes B = c*(r) with I(r, c*) = I*, and a
metric M (throughput per rated kW by default) is read there. Its sensitivity to a chip resource r follows from the
implicit function theorem on I(r, c*(r)) = I*:

    dc*/dr = -(dI/dr) / (dI/dB),    dM/dr = dM/dr|_B + dM/dB x dc*/dr,    e = d ln M / d ln r = r / M x dM/dr

with the partial derivatives from JAX. The linearised gain per +step of r is 100 x step x e (%); the actual gain,
re-solving c* on the perturbed chip, is reported beside it. The derivatives in B are JAX's; should one come out
non-finite (a kink the model may grow, as ``routing.ep_imbalance`` had at ep = 1 before its guard), a central
difference in B replaces it (the chip derivatives are unaffected).

Results are plain Python (floats, strs, lists, dicts) for study.json and the report.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from arch_space.chip import NUMERIC_FIELDS, Chip
from arch_space.errors import ConfigError
from serving.compile import jit
from serving.kernel_table import KernelTable
from serving.memory import max_sequences, memory_code
from serving.perf import Mapping, ServingParams, Work, kernel_times, micro_batch, \
    power_capped, step_time
from serving.precision import MATH_DTYPES
from serving.scenario import Scenario
from serving.serve import METRICS, _lengths, evaluate_point, prefill_terms, step_mix

# (chip field, label) of the resources a design can buy more of
RESOURCES = (
    ("bf16_flops_per_s", "BF16 compute"),
    ("fp8_flops_per_s", "FP8 compute"),
    ("fp4_flops_per_s", "FP4 compute"),
    ("hbm_bandwidth_bytes_per_s", "HBM bandwidth"),
    ("hbm_capacity_bytes", "HBM capacity"),
    ("sram_capacity_bytes", "SRAM capacity"),
    ("sram_bandwidth_bytes_per_s", "SRAM bandwidth"),
    ("scaleup_bandwidth_bytes_per_s", "scale-up bandwidth"),
    ("power_rating_w", "power rating"),
)
# (serving parameter, label) of what the design's software rather than its silicon sets, reported per -10% (less
# overhead pays): a decode step at an interactivity target can be mostly fixed launch and host overhead (DeepSeek-R1
# at 100 tok/s/user: 58-69% of the step in the default study, docs/fidelity.md), and then a leaner runtime (graph
# capture, fused or persistent kernels) pays more than any resource above
SOFTWARE = (("kernel_overhead_s", "per-kernel overhead (-10%)"),)
SOFTWARE_PREFIX = "serving."  # a software row's ``resource`` is serving.<parameter>
# Upper end of the concurrency search: the model is defined at any B and memory feasibility is judged separately,
# so the bracket is wider than any swept grid (2^20 sequences exceed every HBM at any real context).
MAX_CONCURRENCY = 2.0 ** 20
# Geometric bisection on [1, 2^20]: ~ log2(20 / 2^-24) = 29 halvings reach float32 resolution; 64 leaves slack.
_BISECTIONS = 64
_B_STEP = 1e-3  # relative step of the central difference in B (float32 noise ~1e-7 / 1e-3 stays below 1e-4)
_RESIDUAL = 1e-3  # |I(c*) / I* - 1| above this means I jumps across the target (a step in the model)
_STEP_NOISE_PCT = 1e-6  # a finite-difference gain this small with a zero gradient is no change at all

METHOD_GRADIENT = "gradient"
METHOD_ABSENT = "absent on this chip"
METHOD_UNREACHABLE = "target not reachable"
METHOD_CAPACITY = "finite difference only: capacity limits the batch"
METHOD_JUMP = "finite difference only: interactivity jumps at the matched concurrency"
METHOD_STEP = "finite difference only: the model steps within the change"


# ---------------------------------------------------------------------------------------------- inputs
def _plain_chip(chip: Chip) -> Chip:
    """The chip's figures as float32 scalars without identity metadata, so every preset shares one compiled program."""
    if chip.batch_size is not None:
        raise ConfigError("chip", f"expected one design, got a batch of {chip.batch_size}")
    vals = {f: None if getattr(chip, f) is None else jnp.asarray(getattr(chip, f), jnp.float32)
            for f in NUMERIC_FIELDS}
    return Chip(**vals)


def _plain_scenario(sc: Scenario) -> Scenario:
    """The scenario without its name, description and concurrency grid (static fields the evaluator never reads),
    so scenarios that differ only there share one compiled program."""
    return dataclasses.replace(sc, name="", description="", concurrency=())


def _f32(tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), tree)


def decode_work(sc: Scenario, concurrency) -> Work:
    """A decode-only step at concurrency B (serve.step_mix): B sequences decoding at the mean decode context, no
    prefill (closed-loop iterations that also prefill are mixed in by the attribution, not by the roofline)."""
    return step_mix(sc, concurrency)[0]


def prefill_work(sc: Scenario) -> Work:
    """One request's prefill on its own (serve.prefill_terms)."""
    return Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=1.0,
                prefill_len=_lengths(sc)[0])


# ---------------------------------------------------------------------------------------------- matched concurrency
def _bisect(ok, lo, hi):
    """Largest B in [lo, hi] with ok(B), for ok true below a threshold and false above (geometric bisection)."""
    def body(_, bounds):
        a, b = bounds
        mid = jnp.sqrt(a * b)
        good = ok(mid)
        return jnp.where(good, mid, a), jnp.where(good, b, mid)

    return jax.lax.fori_loop(0, _BISECTIONS, body, (lo, hi))[0]


@jit
def _matched(chip, kt, p, sc, m, target, hi):
    pre = prefill_terms(chip, kt, p, sc, m)  # independent of B

    def meets(b):
        return evaluate_point(chip, kt, p, sc, m, b, pre)["interactivity_tok_s_user"] >= target

    one = jnp.float32(1.0)
    c = _bisect(meets, one, hi)
    return jnp.where(meets(one) & ~meets(hi), c, jnp.nan)


@jit
def _memory_limit(chip, kt, p, sc, m, hi):
    """Largest B whose weights + KV at the scenario's longest context fit (memory_code 0); NaN if B = 1 does not."""
    ctx = jnp.asarray(sc.max_context_tokens, jnp.float32)
    cap = max_sequences(chip, kt, p, m, ctx)
    fits_one = memory_code(chip, kt, p, m, jnp.float32(1.0), ctx)[0] == 0
    return jnp.where(fits_one, jnp.minimum(cap, hi), jnp.nan)


_point = jit(evaluate_point)


def matched_concurrency(chip: Chip, kt: KernelTable, params: ServingParams, scenario: Scenario, mapping: Mapping,
                        target_tok_s_user: float, max_concurrency: float = MAX_CONCURRENCY) -> float:
    """The continuous concurrency B in [1, max_concurrency] where interactivity equals the target (the largest B
    that still meets it); NaN if B = 1 is already too slow or even max_concurrency is faster than the target."""
    c = _matched(_plain_chip(chip), kt, _f32(params), _plain_scenario(scenario), _f32(mapping),
                 jnp.float32(target_tok_s_user), jnp.float32(max_concurrency))
    return float(c)


def _operating_point(chip, kt, p, sc, m, target, hi):
    """(B, clamped): c* when its weights + KV fit; else (KV does not fit) the largest B that fits, where the
    interactivity is above the target; NaN when neither exists (B = 1 too slow, weights or mapping do not fit)."""
    c = float(_matched(chip, kt, p, sc, m, jnp.float32(target), hi))
    if not math.isfinite(c):
        return math.nan, False
    code = int(memory_code(chip, kt, p, m, c, jnp.asarray(sc.max_context_tokens, jnp.float32))[0])
    if code == 0:
        return c, False
    if code != 3:
        return math.nan, False
    return float(_memory_limit(chip, kt, p, sc, m, jnp.float32(c))), True


# ---------------------------------------------------------------------------------------------- sensitivities
@functools.partial(jit, static_argnames="metric")
def _slopes(chip, kt, p, sc, m, c, metric):
    """(M, I) at (chip, B = c): their derivatives in every chip figure, in every serving parameter, and in B."""
    def f(ch, pp, b):
        out = evaluate_point(ch, kt, pp, sc, m, b)
        return jnp.stack([out[metric], out["interactivity_tok_s_user"]])

    d_chip, d_p, d_b = jax.jacrev(f, argnums=(0, 1, 2))(chip, p, c)
    # a guard (module docstring): a non-finite derivative in B falls back to a central difference
    up, down = c * (1.0 + _B_STEP), c * (1.0 - _B_STEP)
    fd_b = (f(chip, p, up) - f(chip, p, down)) / (up - down)
    return d_chip, d_p, jnp.where(jnp.all(jnp.isfinite(d_b)), d_b, fd_b)


def _row(field, label, elasticity, gain_gradient, gain_fd, method) -> dict:
    return {"resource": field, "label": label, "elasticity": float(elasticity),
            "gain_pct_gradient": float(gain_gradient), "gain_pct_fd": float(gain_fd), "method": method}


def resource_sensitivities(chip: Chip, kt: KernelTable, params: ServingParams, scenario: Scenario,
                           mapping: Mapping, target_tok_s_user: float, metric: str = "total_tok_s_per_kw",
                           step: float = 0.10) -> list[dict]:
    """Per resource of RESOURCES: the elasticity of ``metric`` at matched interactivity (gradient, implicit function
    theorem), the linearised gain of +``step`` (%) and the actual one re-solving the matched concurrency (%). Then
    the same per serving parameter of SOFTWARE (``resource`` serving.<name>), whose gains are for -``step``: less
    overhead (the elasticity is still d ln M / d ln parameter, so negative where the overhead costs).

    ``method`` says which figure to trust: "gradient" (both agree to first order; a resource that does not bind,
    e.g. HBM capacity while the KV fits, has exactly 0), "absent on this chip" (the chip has none of it: FP4 math
    then runs at the FP8 rate, so more FP4 changes nothing), "target not reachable" (NaN: B = 1 misses the target
    or the KV at c* does not fit, so capacity binds and no matched point exists), or "finite difference only: ..."
    when the +step change crosses a limit the gradient cannot see (the larger c* no longer fits, so the batch is
    capped by capacity; a step in the model such as an SRAM cache that starts to fit). Then the elasticity is the
    local derivative and gain_pct_fd the actual change.
    """
    if metric not in METRICS:
        raise ConfigError("metric", f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    ch, p, m, scenario = _plain_chip(chip), _f32(params), _f32(mapping), _plain_scenario(scenario)
    hi = jnp.float32(MAX_CONCURRENCY)
    c0 = float(_matched(ch, kt, p, scenario, m, jnp.float32(target_tok_s_user), hi))
    base = _point(ch, kt, p, scenario, m, c0) if math.isfinite(c0) else None
    reachable = base is not None and int(base["infeasible_code"]) == 0
    nan = math.nan
    if reachable:
        m0 = float(base[metric])
        jump = abs(float(base["interactivity_tok_s_user"]) / target_tok_s_user - 1.0) > _RESIDUAL
        d_chip, d_p, d_b = _slopes(ch, kt, p, scenario, m, jnp.float32(c0), metric)
        dm_db, di_db = (float(x) for x in d_b)
    rows = []
    # chip resources per +step, then the software's overheads per -step (``sign``)
    items = [(field, label, ch, getattr(chip, field), +1.0) for field, label in RESOURCES] + \
            [(field, label, p, getattr(params, field), -1.0) for field, label in SOFTWARE]
    for field, label, owner, value, sign in items:
        name = field if owner is ch else SOFTWARE_PREFIX + field
        r = float(value)
        if r == 0.0:
            rows.append(_row(name, label, 0.0, 0.0, 0.0, METHOD_ABSENT))
            continue
        if not reachable:
            rows.append(_row(name, label, nan, nan, nan, METHOD_UNREACHABLE))
            continue
        dm_dr, di_dr = (float(x) for x in getattr(d_chip if owner is ch else d_p, field))
        total = dm_dr - dm_db * di_dr / di_db if di_dr != 0.0 else dm_dr  # dM/dr along I = I*
        e = r * total / m0
        changed = dataclasses.replace(owner, **{field: jnp.float32(r * (1.0 + sign * step))})
        more, pm = (changed, p) if owner is ch else (ch, changed)
        c1, clamped = _operating_point(more, kt, pm, scenario, m, target_tok_s_user, hi)
        m1 = float(_point(more, kt, pm, scenario, m, c1)[metric]) if math.isfinite(c1) else nan
        fd = 100.0 * (m1 / m0 - 1.0)
        if jump:  # c* sits on a jump of I(B): the implicit function theorem does not apply
            rows.append(_row(name, label, nan, nan, fd, METHOD_JUMP))
            continue
        method = METHOD_GRADIENT
        if clamped:
            method = METHOD_CAPACITY
        elif total == 0.0 and abs(fd) > _STEP_NOISE_PCT:
            method = METHOD_STEP
        rows.append(_row(name, label, e, 100.0 * step * sign * e, fd, method))
    return rows


# ---------------------------------------------------------------------------------------------- time attribution
def _split(chip, kt, p, m, w, drafts):
    """A step's (power-capped) time by what binds, plus ``drafts`` MTP draft passes as serve.evaluate_point adds
    them: t_iter = t_step + drafts x t_draft_layer / clock."""
    t0, out = step_time(chip, kt, p, m, w)
    t, _, clock = power_capped(chip, out, t0)
    runs = kt.count + drafts * kt.draft_count  # kernel executions: the step's, then each draft's last layer + head
    bound = out["t_compute"] >= out["t_memory"]  # a kernel costs max(compute, memory): the larger one binds
    compute = jnp.sum(jnp.where(bound, out["t_compute"], 0.0) * runs)
    memory = jnp.sum(jnp.where(bound, 0.0, out["t_memory"]) * runs)
    overhead = p.kernel_overhead_s * jnp.sum(runs) + p.step_overhead_s
    # step_time: t_cm + t_comm - overlap x min(t_cm, t_comm): what is not hidden is exposed network time
    t_cm, t_comm = jnp.sum(out["t"] * kt.count), jnp.sum(out["t_comm"] * kt.count)
    exposed = t_comm - p.comm_overlap * jnp.minimum(t_cm, t_comm)
    draft_s = drafts * out["t_draft_layer"]
    power = (t - t0) + draft_s * (1.0 / clock - 1.0)  # the cap stretches the step and its drafts by 1 / clock
    return {"compute_s": compute, "memory_s": memory, "network_s": exposed + out["t_p2p"], "overhead_s": overhead,
            "power_s": power, "total_s": t + draft_s / clock}


@jit
def _attribution(chip, kt, p, sc, m, concurrency):
    dec, mix, _, share = step_mix(sc, concurrency, m.dp)
    decode = _split(chip, kt, p, m, dec, sc.draft_tokens)
    if mix is not None:
        # a request's iteration as serve.evaluate_point times its TPOT: (1 - share) decode-only iterations, share
        # that carry another request's prefill; drafts on every one
        with_prefill = _split(chip, kt, p, m, mix, 0.0)
        drafts = jax.tree_util.tree_map(jnp.subtract, decode, _split(chip, kt, p, m, dec, 0.0))
        decode = {k: (1.0 - share) * decode[k] + share * (with_prefill[k] + drafts[k]) for k in decode}
    return {"prefill": _split(chip, kt, p, m, prefill_work(sc), 0.0), "decode": decode}


def time_attribution(chip: Chip, kt: KernelTable, params: ServingParams, scenario: Scenario, mapping: Mapping,
                     concurrency: float) -> dict:
    """Seconds of one request's prefill and of one decode iteration at ``concurrency``, split into compute, memory,
    network (exposed collectives + PP send/recv), overhead (kernel launches + step) and power (the cap's stretch).

    "decode" is what serve.evaluate_point times per iteration (= TPOT x tokens per step): in closed loop that step
    also runs the chunked prefill of the requests replacing finished ones, and under MTP it includes the drafts.
    """
    out = _attribution(_plain_chip(chip), kt, _f32(params), _plain_scenario(scenario), _f32(mapping),
                       jnp.float32(concurrency))
    return {phase: {k: float(v) for k, v in parts.items()} for phase, parts in out.items()}


# ---------------------------------------------------------------------------------------------- roofline
def _rows(chip, kt, p, m, w):
    """Per kernel row: FLOPs by dtype, bytes moved and time, each x count, per chip. kernel_times only returns step
    totals, and those are sums over rows weighted by ``count``; a one-hot ``count`` reads one row's FLOPs and
    moved bytes (SRAM + HBM: the split depends on the total resident bytes, their sum does not). Under PP, per
    iteration: the stack at one micro-batch (serving.perf.micro_batch), as step_time runs it."""
    w = micro_batch(m, w)
    out = kernel_times(chip, kt, p, m, w)

    def one(onehot):
        o = kernel_times(chip, dataclasses.replace(kt, count=onehot), p, m, w)
        return o["flops_by_dtype"], o["hbm_bytes"] + o["sram_bytes"]

    by_dtype, moved = jax.vmap(one)(jnp.eye(kt.num_kernels))
    return by_dtype * kt.count[:, None], moved * kt.count, out["t"] * kt.count


@jit
def _kernel_points(chip, kt, p, sc, m, concurrency):
    return {"decode": _rows(chip, kt, p, m, decode_work(sc, concurrency)),
            "prefill": _rows(chip, kt, p, m, prefill_work(sc))}


def roofline_points(chip: Chip, kt: KernelTable, params: ServingParams, scenario: Scenario, mapping: Mapping,
                    concurrency: float) -> dict:
    """Roofline points of every kernel row of the decode step at ``concurrency`` and of one prefill, per chip and
    at full clock (the power cap stretches whole steps, see time_attribution). ``bytes`` are all bytes moved, SRAM
    and HBM; ``peak_flops_per_s`` is the rate of the dtype with the most FLOPs (``math_dtype``)."""
    ch, p, m, scenario = _plain_chip(chip), _f32(params), _f32(mapping), _plain_scenario(scenario)
    computed = {ph: [np.asarray(x, np.float64) for x in rows]
                for ph, rows in _kernel_points(ch, kt, p, scenario, m, jnp.float32(concurrency)).items()}
    dtype = MATH_DTYPES[int(np.argmax(sum(by[0].sum(axis=0) for by in computed.values())))]
    points = []
    for phase, (by_dtype, moved, seconds) in computed.items():
        flops = by_dtype.sum(axis=1)
        for k, name in enumerate(kt.names):
            if flops[k] == 0.0 and moved[k] == 0.0:
                continue
            points.append({"kernel": name, "phase": phase, "flops": float(flops[k]), "bytes": float(moved[k]),
                           "time_s": float(seconds[k]),
                           "intensity_flop_per_byte": float(flops[k] / moved[k]) if moved[k] > 0 else math.inf,
                           "achieved_flops_per_s": float(flops[k] / seconds[k])})
    return {"peak_flops_per_s": float(ch.math_rate(dtype)), "math_dtype": dtype,
            "hbm_bandwidth_bytes_per_s": float(ch.hbm_bandwidth_bytes_per_s),
            "sram_bandwidth_bytes_per_s": float(ch.sram_bandwidth_bytes_per_s), "points": points}


__all__ = ["RESOURCES", "MAX_CONCURRENCY", "matched_concurrency", "resource_sensitivities", "time_attribution",
           "roofline_points", "decode_work", "prefill_work", "METHOD_GRADIENT", "METHOD_ABSENT", "METHOD_UNREACHABLE",
           "METHOD_CAPACITY", "METHOD_JUMP", "METHOD_STEP"]
