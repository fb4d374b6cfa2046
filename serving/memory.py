"""Memory feasibility of a serving instance on a chip: weights and KV per chip under a parallel mapping.

Weights per chip: the non-routed weights split over tp (but those every TP rank holds whole, MLA's down-projections:
``kernel_table._TP_REPLICATED_OPS``), the routed experts over the tp x dp chips of a stage, everything over the pp
stages. KV per sequence per chip: heads split over min(tp, KV heads) (MLA's shared latent does not split), layers
over pp, and the sequences spread over the dp replicas. Usable: HBM less the reserve the engine keeps (activations,
workspace, fragmentation), plus SRAM that explicit placement pins. A point is infeasible with the first reason of
``INFEASIBLE_REASONS`` that applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp

if TYPE_CHECKING:
    from arch_space.chip import Chip
    from serving.kernel_table import KernelTable
    from serving.perf import Mapping, ServingParams

INFEASIBLE_REASONS = {
    1: "tensor / pipeline parallel group wider than the scale-up domain",
    2: "weights do not fit in HBM under this mapping",
    3: "KV cache for this concurrency does not fit in HBM",
}


def memory_terms(chip: Chip, kt: KernelTable, p: ServingParams, m: Mapping, max_context):
    """(weight bytes per chip, KV bytes per sequence at ``max_context`` per chip, usable bytes per chip)."""
    n_stage = m.tp * m.dp
    experts = jnp.sum(kt.expert_weight_bytes * kt.count)
    whole = jnp.sum(kt.weight_bytes * kt.tp_replicated * kt.count)  # held whole by every TP rank
    weights = ((kt.weight_bytes_total - experts - whole) / m.tp + whole + experts / n_stage) / m.pp
    per_seq = jnp.sum(kt.kv_write_b * jnp.minimum(max_context, kt.ctx_cap) * kt.count) \
        / (m.dp * jnp.minimum(m.tp, kt.kv_split_limit) * m.pp)
    # bytes pinned in explicitly placed SRAM need no HBM copy
    usable = (1.0 - p.hbm_reserve_fraction) * chip.hbm_capacity_bytes \
        + chip.sram_explicit_fraction * chip.sram_capacity_bytes
    return weights, per_seq, usable


def memory_code(chip: Chip, kt: KernelTable, p: ServingParams, m: Mapping, sequences, max_context):
    """0 if weights + KV of ``sequences`` at ``max_context`` fit in (1 - reserve) x HBM under the mapping."""
    weights, per_seq, usable = memory_terms(chip, kt, p, m, max_context)
    kv = sequences * per_seq
    code = jnp.where(m.tp * m.pp > chip.scaleup_domain_chips, 1,
                     jnp.where(weights > usable, 2, jnp.where(weights + kv > usable, 3, 0)))
    return code.astype(jnp.int32), weights + kv


def max_sequences(chip: Chip, kt: KernelTable, p: ServingParams, m: Mapping, max_context):
    """The most sequences at ``max_context`` whose KV fits beside the weights under the mapping (continuous; floor it
    for a count): memory_code's KV test solved for the sequences, (usable - weights) / KV per sequence per chip,
    a relative 1e-6 inside so that memory_code passes at it despite float32 rounding. What an engine that reserves
    each request's full context (TRT-LLM's GUARANTEED_NO_EVICT scheduler, which trtllm-bench runs) can admit at
    once. Negative when the weights alone do not fit."""
    weights, per_seq, usable = memory_terms(chip, kt, p, m, max_context)
    return (usable - weights) / jnp.maximum(per_seq, 1e-9) * (1.0 - 1e-6)


__all__ = ["INFEASIBLE_REASONS", "memory_terms", "memory_code", "max_sequences"]
