"""The per-phase cost profile of a workload: what one step reads, computes and sends, as numbers.

:func:`build_profile` condenses a model architecture, a precision recipe and a scenario's lengths into a
:class:`WorkloadProfile` pytree that the roofline evaluator consumes: weight bytes that every step touches, the
bytes of one routed expert, FLOPs per token by math dtype, KV bytes per sequence, and attention FLOPs. It is a
pytree of scalars so the evaluator can ``jit`` once per workload and ``vmap`` over designs.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from serving.precision import MATH_DTYPES, Precision
from serving.scenario import Scenario

# Tensor class of ModelArchitecture.param_counts() -> recipe class that sets its dtype.
_RECIPE_CLASS = {
    "attention": "attention", "dense_ffn": "dense_ffn", "routed_experts": "routed_experts",
    "shared_experts": "shared_experts", "router": "attention", "norms": "attention",
    "embedding": "embeddings", "lm_head": "embeddings", "vision": "attention", "mtp": "routed_experts",
}


@dataclasses.dataclass(frozen=True)
class WorkloadProfile:
    total_weight_bytes: float  # every resident weight (all experts, embeddings)
    step_weight_bytes: float  # weights every forward pass reads, whatever the batch (all but routed experts)
    expert_bytes: float  # one routed expert of one MoE layer
    num_moe_layers: float
    num_experts: float
    experts_per_token: float
    flops_per_token: tuple  # matmul FLOPs per token, one entry per MATH_DTYPES
    attn_math_index: int  # static: which MATH_DTYPES entry attention math runs in
    decode_attn_flops_per_seq: float  # per decode step at the mean decode context
    prefill_flops_per_seq: tuple  # per dtype, one request's whole prefill (matmul part)
    prefill_attn_flops_per_seq: float
    kv_bytes_per_seq_decode: float  # KV read per step at the mean decode context
    kv_bytes_per_seq_max: float  # KV footprint of one sequence at isl + osl
    kv_bytes_per_token: float  # KV written per new token (all layers)
    hidden_size: float
    num_layers: float
    activation_bytes: float
    isl_tokens: float
    osl_tokens: float


jax.tree_util.register_dataclass(
    WorkloadProfile,
    data_fields=[f.name for f in dataclasses.fields(WorkloadProfile) if f.name != "attn_math_index"],
    meta_fields=["attn_math_index"])


def _prefill_attention_flops(arch, isl: int) -> float:
    """Sum of per-token attention FLOPs over a causal prefill of ``isl`` tokens (trapezoid over 65 points)."""
    ts = np.linspace(1, isl, 65)
    vals = np.asarray([arch.decode_attention_flops_per_token(int(round(t))) for t in ts], dtype=np.float64)
    return float(np.trapezoid(vals, ts))


def build_profile(arch, precision: Precision, scenario: Scenario) -> WorkloadProfile:
    counts = arch.param_counts()
    total_bytes = 0.0
    step_bytes = 0.0
    for cls, n in counts.items():
        if cls == "mtp":
            continue  # the MTP head is only resident when speculative decoding uses it (serving-model issue)
        b = n * precision.of(_RECIPE_CLASS[cls]).bytes_per_weight
        total_bytes += b
        if cls not in ("routed_experts", "embedding"):
            step_bytes += b  # the input embedding is a gather of B rows, not a weight read
    flops = np.zeros(len(MATH_DTYPES))
    active = arch.active_param_counts()
    for cls, n in active.items():
        if cls in ("embedding", "mtp"):
            continue
        flops[MATH_DTYPES.index(precision.of(_RECIPE_CLASS[cls]).math)] += 2.0 * n
    isl, osl = scenario.mean_isl_tokens, scenario.mean_osl_tokens
    decode_ctx = int(round(isl + osl / 2))
    kv_el = precision.kv_bytes_per_element
    return WorkloadProfile(
        total_weight_bytes=total_bytes,
        step_weight_bytes=step_bytes,
        expert_bytes=arch.expert_params * precision.routed_experts.bytes_per_weight if arch.num_moe_layers else 0.0,
        num_moe_layers=float(arch.num_moe_layers),
        num_experts=float(max(arch.num_experts or 1, 1)),
        experts_per_token=float(arch.experts_per_token or 0),
        flops_per_token=tuple(float(f) for f in flops),
        attn_math_index=MATH_DTYPES.index(precision.attention.math),
        decode_attn_flops_per_seq=float(arch.decode_attention_flops_per_token(decode_ctx)),
        prefill_flops_per_seq=tuple(float(f * isl) for f in flops),
        prefill_attn_flops_per_seq=_prefill_attention_flops(arch, int(round(isl))),
        kv_bytes_per_seq_decode=float(arch.kv_cache_elements(decode_ctx)) * kv_el,
        kv_bytes_per_seq_max=float(arch.kv_cache_elements(int(round(isl + osl)))) * kv_el,
        kv_bytes_per_token=float(arch.kv_cache_elements_per_token_per_layer * arch.num_layers) * kv_el,
        hidden_size=float(arch.hidden_size),
        num_layers=float(arch.num_layers),
        activation_bytes=precision.activation_bytes,
        isl_tokens=float(isl),
        osl_tokens=float(osl),
    )
