"""The serving model: (chip, workload kernel table, scenario, mapping, concurrency) -> InferenceX metrics.

Pure ``jax.numpy``; :func:`evaluate_grid` is jit-compiled and vmapped over a batch of chip designs, mappings and
concurrencies, and differentiable in every continuous chip and model parameter. Metric definitions follow the
reference README (InferenceX): TTFT, TPOT, E2E = TTFT + (OSL - 1) x TPOT, interactivity = 1 / TPOT (tok/s/user),
throughput per chip = (input + output) tokens/s / chips, per kW of the chip rating (the custom-chip disclosure's
basis), per kW of modelled sustained power, per all-in provisioned kW (InferenceX's basis, where the preset has
it), joules per token = sustained watts / tokens/s, and $ per million tokens = $/chip-s x 1e6 / tokens/s per chip
(InferenceX TCO calculator).

Closed loop at concurrency B (continuous batching): B x tokens_per_step / OSL requests replace finished ones per
iteration, each prefilled whole inside a decode step that streams the weights once for both; the other iterations
only decode (:func:`step_mix`). TTFT = the request's own prefill + one iteration as its TPOT sees it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from arch_space.chip import Chip
from serving.compile import jit
from serving.kernel_table import KernelTable
from serving.memory import memory_code
from serving.perf import Mapping, ServingParams, Work, power_capped, step_time
from serving.scenario import Scenario

METRICS = ("ttft_s", "tpot_s", "e2e_s", "interactivity_tok_s_user", "output_tok_s_per_chip", "total_tok_s_per_chip",
           "total_tok_s_per_kw", "total_tok_s_per_sustained_kw", "total_tok_s_per_allin_kw", "joules_per_token",
           "usd_per_mtok", "sustained_power_w", "clock_factor", "prefill_input_tok_s_per_chip",
           "decode_output_tok_s_per_chip", "prefill_pool_fraction", "decode_compute_s", "decode_memory_s",
           "decode_comm_s", "hbm_used_bytes", "chips")


def _throttled_step(chip, kt, p, m, work):
    """A step at the clock the power rating allows (serving.perf.power_capped)."""
    t0, out = step_time(chip, kt, p, m, work)
    t, watts, clock = power_capped(chip, out, t0)
    return t, out, watts, clock


def _prefill_only(chip, kt, p, m, requests, length):
    work = Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=requests, prefill_len=length)
    return _throttled_step(chip, kt, p, m, work)[0]


def _lengths(sc: Scenario):
    isl, osl = sc.mean_isl_tokens, sc.mean_osl_tokens
    if sc.kind == "agentic":
        # one turn on average: new input plus the uncached part of the earlier context; decode at the mean context
        ctx_mean = isl + (sc.turns - 1) / 2.0 * (sc.turn_input_tokens + osl)
        new_in = (isl + (sc.turns - 1) * (sc.turn_input_tokens + (1 - sc.prefix_cache_hit_rate)
                                          * (isl + sc.turns / 2.0 * (sc.turn_input_tokens + osl)))) / sc.turns
        return new_in, ctx_mean + osl / 2.0, osl
    return isl, isl + osl / 2.0, osl


def step_mix(sc: Scenario, concurrency, replicas=1.0):
    """The decode iteration at concurrency B as a mix of two steps, a decode-only one and one that also prefills
    (the four values returned are below). In closed loop rho = B x tokens_per_step / OSL requests replace
    finished ones per iteration. A request's prompt is prefilled in one piece (engines' chunks, 8-16k tokens, hold
    the benchmark prompts whole), so for rho < 1 a share rho of iterations carries one whole prefill and the rest
    decode only; for rho >= 1 every iteration carries rho of them. Spreading a fraction of a prompt over every
    step instead would touch far more routed experts per step than the lumpy truth (expected experts are concave
    in the tokens: Jensen) and bury a low-concurrency MoE decode under prefill weight reads.

    Under attention-DP (``replicas`` = dp) a prompt lives on one replica and every rank waits for the busiest at
    the experts' all-to-all (serving.perf.kernel_times), so the engine holds new prompts until each replica has one
    (TensorRT-LLM's attention-DP balancing, ``attention_dp_config.enable_balance``): a share rho / dp of iterations
    carries dp prompts, one a replica, and rho >= dp prompts spread evenly (with dp = 1 the rule above). The wait this
    adds to a prompt's TTFT (up to dp / rho iterations) is not charged.

    Returns (decode-only work, prefill-carrying work, share for throughput, share for latency). Throughput pays
    every prefill; a request's own TPOT only the prefills of the B - 1 others that land during its decode
    (InferenceX: TPOT = (E2E - TTFT) / (OSL - 1)), a share (B - 1) / B of them: at B = 1 TPOT is pure decode.
    Disaggregated: the decode pool never prefills (prefill-carrying work None, shares 0)."""
    pre_len, dec_ctx, osl = _lengths(sc)
    b = jnp.asarray(concurrency, dtype=jnp.float32)
    dec = Work(decode_tokens=b, decode_queries=1.0 + sc.draft_tokens, context=dec_ctx, prefill_requests=0.0,
               prefill_len=pre_len)
    if sc.kind == "disaggregated":
        return dec, None, jnp.float32(0.0), jnp.float32(0.0)
    rho = b * sc.tokens_per_step / osl
    n = jnp.maximum(rho, replicas)
    share = rho / n
    return dec, dataclasses.replace(dec, prefill_requests=n), share, share * (b - 1.0) / jnp.maximum(b, 1.0)


def prefill_terms(chip: Chip, kt: KernelTable, p: ServingParams, sc: Scenario, m: Mapping):
    """What does not depend on the concurrency: one request's prefill time and, disaggregated, the prefill pool's
    input tokens/s per chip (requests batched up to prefill_batch_tokens per attention replica: the engines'
    token budget per forward pass, SGLang's chunked-prefill size or TRT-LLM's max_num_tokens, is per DP rank)."""
    pre_len, _, _ = _lengths(sc)
    t_pre = _prefill_only(chip, kt, p, m, 1.0, pre_len)
    if sc.kind == "disaggregated":
        r = jnp.maximum(1.0, sc.prefill_batch_tokens * m.dp / pre_len)
        pool = r * pre_len / _prefill_only(chip, kt, p, m, r, pre_len) / m.chips
    else:
        pool = pre_len / t_pre / m.chips  # one request's prefill on its own
    return t_pre, pool


def evaluate_point(chip: Chip, kt: KernelTable, p: ServingParams, sc: Scenario, m: Mapping, concurrency,
                   prefill=None):
    """Every metric of one operating point. ``prefill`` = prefill_terms(...) when already computed."""
    b = jnp.asarray(concurrency, dtype=jnp.float32)
    pre_len, dec_ctx, osl = _lengths(sc)
    tau = sc.tokens_per_step
    chips = m.chips
    t_pre, prefill_in_per_chip = prefill_terms(chip, kt, p, sc, m) if prefill is None else prefill
    dec_work, mix_work, share, share_lat = step_mix(sc, b, m.dp)
    sums = ("t_compute", "t_memory", "t_comm")
    if mix_work is None:  # disaggregated: the decode pool never prefills
        t_d, out, watts_d, clock_d = _throttled_step(chip, kt, p, m, dec_work)
        t_step, t_lat, watts, clock = t_d, t_d, watts_d, clock_d
        details = {k: jnp.sum(out[k] * kt.count) for k in sums}
    else:
        # both steps as one vmapped evaluation (measured: 3x faster on the CPU than two separate calls)
        fields = [f.name for f in dataclasses.fields(Work)]
        both = {f: jnp.stack([jnp.asarray(getattr(dec_work, f), jnp.float32),
                              jnp.asarray(getattr(mix_work, f), jnp.float32)]) for f in fields}
        ts, outs, ws, cs = jax.vmap(lambda w: _throttled_step(chip, kt, p, m, Work(**w)))(both)
        t_d, t_m, watts_d, watts_m, clock_d, clock_m = ts[0], ts[1], ws[0], ws[1], cs[0], cs[1]
        out = jax.tree_util.tree_map(lambda x: x[0], outs)
        out_m = jax.tree_util.tree_map(lambda x: x[1], outs)
        t_step = (1.0 - share) * t_d + share * t_m  # mean iteration: what throughput pays
        t_lat = (1.0 - share_lat) * t_d + share_lat * t_m  # what one request's TPOT sees
        watts = ((1.0 - share) * watts_d * t_d + share * watts_m * t_m) / t_step  # energy over time
        clock = ((1.0 - share) * clock_d * t_d + share * clock_m * t_m) / t_step  # unconstrained over capped
        details = {k: (1.0 - share) * jnp.sum(out[k] * kt.count) + share * jnp.sum(out_m[k] * kt.count)
                   for k in sums}
    # MTP drafts run before each verify step, on the decoding sequences only
    drafts = sc.draft_tokens * out["t_draft_layer"] / clock_d
    t_iter = t_step + drafts
    tpot = (t_lat + drafts) / tau
    decode_out_per_chip = b * tau / t_iter / chips
    if sc.kind == "disaggregated":
        kv_bytes = jnp.sum(kt.kv_write_b * jnp.minimum(pre_len, kt.ctx_cap) * kt.count)
        ttft = t_pre + kv_bytes / chip.scaleout_bandwidth_bytes_per_s + tpot * tau
        rate_p = prefill_in_per_chip / pre_len  # requests / s per prefill chip
        rate_d = decode_out_per_chip / osl  # requests / s per decode chip
        frac = (rate_d / (rate_p + rate_d) if sc.prefill_pool_fraction is None
                else jnp.asarray(sc.prefill_pool_fraction, jnp.float32))
        req_per_chip = jnp.minimum(frac * rate_p, (1.0 - frac) * rate_d)
        out_per_chip = req_per_chip * osl
        total_per_chip = req_per_chip * (pre_len + osl)
    else:
        ttft = t_pre + tpot * tau
        frac = jnp.asarray(0.0, jnp.float32)
        out_per_chip = decode_out_per_chip
        total_per_chip = out_per_chip * (pre_len + osl) / osl
    e2e = ttft + (osl - 1.0) * tpot
    if sc.kind == "agentic":
        e2e = sc.chain_steps * (e2e + sc.tool_gap_s)  # a chain of dependent turns, tool calls in between
    code, used = memory_code(chip, kt, p, m, b, jnp.asarray(sc.max_context_tokens, jnp.float32))
    kw = chip.power_rating_w / 1000.0
    allin = jnp.where(chip.allin_power_w > 0, total_per_chip / (chip.allin_power_w / 1000.0), jnp.nan)
    return {
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "interactivity_tok_s_user": 1.0 / tpot,
        "output_tok_s_per_chip": out_per_chip, "total_tok_s_per_chip": total_per_chip,
        "total_tok_s_per_kw": total_per_chip / kw,
        "total_tok_s_per_sustained_kw": total_per_chip / (watts / 1000.0),
        "total_tok_s_per_allin_kw": allin,
        "joules_per_token": watts / total_per_chip,
        "usd_per_mtok": chip.rental_usd_per_s * 1e6 / total_per_chip,
        "sustained_power_w": watts, "clock_factor": clock,
        "prefill_input_tok_s_per_chip": prefill_in_per_chip, "decode_output_tok_s_per_chip": decode_out_per_chip,
        "prefill_pool_fraction": frac,
        "decode_compute_s": details["t_compute"], "decode_memory_s": details["t_memory"],
        "decode_comm_s": details["t_comm"], "hbm_used_bytes": used, "chips": chips,
        "infeasible_code": code,
    }


@jit
def evaluate_grid(chips: Chip, kt: KernelTable, p: ServingParams, sc: Scenario, mappings: Mapping, concurrency):
    """Every design x mapping x concurrency: chip leaves [N], mapping leaves [M], concurrency [C] -> [N, M, C]."""
    def per_mapping(chip, m):
        pre = prefill_terms(chip, kt, p, sc, m)  # once per (design, mapping), not per concurrency
        return jax.vmap(lambda c: evaluate_point(chip, kt, p, sc, m, c, pre))(concurrency)

    f = jax.vmap(per_mapping, in_axes=(None, 0))
    f = jax.vmap(f, in_axes=(0, None))
    return f(chips, mappings)


def stack_mappings(mappings: list[Mapping]) -> Mapping:
    return Mapping(*(jnp.asarray([getattr(m, f) for m in mappings], jnp.float32) for f in ("tp", "dp", "ep", "pp")))


__all__ = ["step_mix", "evaluate_point", "evaluate_grid", "stack_mappings", "METRICS", "dataclasses"]
