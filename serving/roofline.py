"""A per-phase roofline of LLM serving, vectorised in JAX: (chip, workload, mapping, concurrency) -> latency and throughput.

This is the plain model the spine runs on (the calibrated serving model with shape-aware efficiencies, collectives
per algorithm and a power model supersedes it). Per step on a tensor-parallel group of ``tp`` chips:

    decode step(B) = max(compute, memory) + TP all-reduces + step overhead
        compute = sum_dtype B x FLOPs/token[dtype] / (tp x rate[dtype] x compute_efficiency)  (+ attention)
        memory  = bytes / (tp x bandwidth x memory_efficiency), SRAM and HBM streaming concurrently: the weights
                  and KV each step re-reads may be placed on chip (as the custom-chip design places the KV cache
                  near compute), split so that both memories finish together, up to the SRAM capacity
        bytes   = always-read weights + MoE layers x E[distinct experts touched by B tokens] x expert bytes
                  + B x KV bytes per sequence
    E[distinct experts] = E (1 - (1 - k/E)^B)  for B tokens routed uniformly, k of E experts each (expected
                  coverage of independent draws; the skew parameter arrives with the operator graphs)
    TP all-reduce (ring, Patarasuk & Yuan 2009): 2 (tp-1)/tp x message / link bandwidth + 2 (tp-1) x hop latency,
                  two per layer (after attention and after the FFN, Megatron-LM, Shoeybi et al. 2019)

A closed loop at concurrency C with continuous batching and chunked prefill runs iterations in which all C
sequences decode one token and C / OSL new requests have their prefill computed in the same pass:

    TPOT = iteration = decode step(C) + (C / OSL) x prefill compute of one request
    TTFT = prefill of one request (its own roofline) + one iteration;   E2E = TTFT + (OSL - 1) x TPOT
    output tokens/s per chip = C / TPOT / tp;  total = output x (ISL + OSL) / OSL

Feasibility: weights / tp + C x KV footprint / tp must fit in (1 - reserve) x HBM; tp must fit the scale-up domain.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from arch_space.chip import Chip
from arch_space.validation import build, quantity
from serving.precision import MATH_DTYPES
from serving.profile import WorkloadProfile

# Infeasibility codes (0 = feasible); the names are what reports print.
INFEASIBLE_REASONS = {
    1: "tensor-parallel degree exceeds the scale-up domain",
    2: "weights do not fit in HBM at this parallel degree",
    3: "KV cache for this concurrency does not fit in HBM",
}


@dataclasses.dataclass(frozen=True)
class ServingParams:
    """Named efficiency and overhead parameters of the roofline (fitted by the calibration work; see conf/serving)."""
    compute_efficiency: float = quantity(default=1.0)
    memory_efficiency: float = quantity(default=1.0)
    link_efficiency: float = quantity(default=1.0)
    step_overhead_s: float = quantity(allow_zero=True, default=0.0)
    hbm_reserve_fraction: float = quantity(allow_zero=True, default=0.1)

    @classmethod
    def from_dict(cls, data, path: str = "serving") -> "ServingParams":
        p = build(cls, data, path)
        for f in ("compute_efficiency", "memory_efficiency", "link_efficiency"):
            if getattr(p, f) > 1:
                from arch_space.errors import ConfigError
                raise ConfigError(f"{path}.{f}", f"must be <= 1 (a fraction of peak), got {getattr(p, f)}")
        return p


jax.tree_util.register_dataclass(ServingParams, data_fields=[f.name for f in dataclasses.fields(ServingParams)],
                                 meta_fields=[])


def _rates(chip: Chip):
    return jnp.stack([chip.math_rate(dt) for dt in MATH_DTYPES])


def expected_experts_touched(num_experts, experts_per_token, tokens):
    """E (1 - (1 - k/E)^B): expected distinct experts hit by B uniformly routed tokens."""
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


def _memory_time(chip: Chip, bytes_per_chip, sram_resident_bytes, eff):
    """SRAM and HBM stream concurrently; the placed bytes split so both finish together (x = T s / (s + h)),
    capped by SRAM capacity and by what may be placed. More capacity or bandwidth of either never slows it."""
    s = chip.sram_bandwidth_bytes_per_s * eff
    h = chip.hbm_bandwidth_bytes_per_s * eff
    on_chip = jnp.minimum(jnp.minimum(sram_resident_bytes, chip.sram_capacity_bytes), bytes_per_chip * s / (s + h))
    return jnp.maximum(on_chip / s, (bytes_per_chip - on_chip) / h)


def _allreduce_time(chip: Chip, message_bytes, tp, params: ServingParams):
    ring = 2.0 * (tp - 1.0) / tp * message_bytes / (chip.scaleup_bandwidth_bytes_per_s * params.link_efficiency)
    return jnp.where(tp > 1, ring + 2.0 * (tp - 1.0) * chip.scaleup_latency_s, 0.0)


def decode_step_time(chip: Chip, w: WorkloadProfile, p: ServingParams, batch, tp):
    rates = _rates(chip) * tp * p.compute_efficiency
    flops = jnp.asarray(w.flops_per_token) * batch
    t_compute = jnp.sum(flops / rates) + batch * w.decode_attn_flops_per_seq / rates[w.attn_math_index]
    touched = expected_experts_touched(w.num_experts, w.experts_per_token, batch)
    weight_bytes = w.step_weight_bytes + w.num_moe_layers * touched * w.expert_bytes
    kv_bytes = batch * w.kv_bytes_per_seq_decode
    per_chip = (weight_bytes + kv_bytes) / tp
    t_memory = _memory_time(chip, per_chip, (w.step_weight_bytes + kv_bytes) / tp, p.memory_efficiency)
    msg = batch * w.hidden_size * w.activation_bytes
    t_comm = 2.0 * w.num_layers * _allreduce_time(chip, msg, tp, p)
    return jnp.maximum(t_compute, t_memory) + t_comm + p.step_overhead_s, t_compute, t_memory, t_comm


def prefill_compute_time(chip: Chip, w: WorkloadProfile, p: ServingParams, tp):
    rates = _rates(chip) * tp * p.compute_efficiency
    return (jnp.sum(jnp.asarray(w.prefill_flops_per_seq) / rates)
            + w.prefill_attn_flops_per_seq / rates[w.attn_math_index])


def prefill_time(chip: Chip, w: WorkloadProfile, p: ServingParams, tp):
    """One request's prefill on its own: compute- or weight-read-bound, plus its TP all-reduces."""
    t_c = prefill_compute_time(chip, w, p, tp)
    touched = expected_experts_touched(w.num_experts, w.experts_per_token, w.isl_tokens)
    read = (w.step_weight_bytes + w.num_moe_layers * touched * w.expert_bytes) / tp
    write = w.isl_tokens * w.kv_bytes_per_token / tp
    t_m = _memory_time(chip, read + write, 0.0, p.memory_efficiency)
    msg = w.isl_tokens * w.hidden_size * w.activation_bytes
    return jnp.maximum(t_c, t_m) + 2.0 * w.num_layers * _allreduce_time(chip, msg, tp, p) + p.step_overhead_s


def evaluate_point(chip: Chip, w: WorkloadProfile, p: ServingParams, concurrency, tp):
    """Metrics of one (chip, tp, concurrency) point; every argument may be traced."""
    concurrency = jnp.asarray(concurrency, dtype=jnp.float32)
    tp = jnp.asarray(tp, dtype=jnp.float32)
    t_dec, t_c, t_m, t_comm = decode_step_time(chip, w, p, concurrency, tp)
    t_pre_c = prefill_compute_time(chip, w, p, tp)
    tpot = t_dec + concurrency / w.osl_tokens * t_pre_c
    ttft = prefill_time(chip, w, p, tp) + tpot
    e2e = ttft + (w.osl_tokens - 1.0) * tpot
    out_per_chip = concurrency / tpot / tp
    total_per_chip = out_per_chip * (w.isl_tokens + w.osl_tokens) / w.osl_tokens
    usable = (1.0 - p.hbm_reserve_fraction) * chip.hbm_capacity_bytes
    weights_per_chip = w.total_weight_bytes / tp
    kv_per_chip = concurrency * w.kv_bytes_per_seq_max / tp
    code = jnp.where(tp > chip.scaleup_domain_chips, 1,
                     jnp.where(weights_per_chip > usable, 2, jnp.where(weights_per_chip + kv_per_chip > usable, 3, 0)))
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "interactivity_tok_s_user": 1.0 / tpot,
        "output_tok_s_per_chip": out_per_chip,
        "total_tok_s_per_chip": total_per_chip,
        "total_tok_s_per_kw": total_per_chip / (chip.power_rating_w / 1000.0),
        "usd_per_mtok": chip.rental_usd_per_s * 1e6 / total_per_chip,
        "decode_compute_s": t_c,
        "decode_memory_s": t_m,
        "decode_comm_s": t_comm,
        "hbm_used_bytes": weights_per_chip + kv_per_chip,
        "infeasible_code": code.astype(jnp.int32),
    }


@jax.jit
def evaluate_batch(chips: Chip, w: WorkloadProfile, p: ServingParams, concurrency, tp):
    """Metrics for every design x tp x concurrency: leaves of ``chips`` are [N]; result arrays are [N, M, C]."""
    over_c = jax.vmap(evaluate_point, in_axes=(None, None, None, 0, None))
    over_tp = jax.vmap(over_c, in_axes=(None, None, None, None, 0))
    over_chips = jax.vmap(over_tp, in_axes=(0, None, None, None, None))
    return over_chips(chips, w, p, concurrency, tp)
