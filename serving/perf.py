"""Kernel-level serving performance on a chip: step times under a parallel mapping, memory and power.

Each kernel of the traced operator graph (``kernel_table.py``) costs, per chip,

    t_k = max( sum_dtype FLOPs_k,dtype / (rate_dtype x eff_compute(kind, rows, K)),
               memory time of its bytes with SRAM and HBM streaming concurrently / eff_memory(bytes) )
          + kernel_overhead

where the achieved compute efficiency is shape-aware, eff = e_max x rows / (rows + rows_half) per kernel kind (dense
GEMMs, attention, grouped MoE GEMMs: small or low-intensity kernels reach a smaller share of peak, the behaviour
roofline studies measure, e.g. Yuan et al., "LLM Inference Unveiled", 2024), times K / (K + k_half) in the
contraction depth K for GEMMs (below), FP4 math reaches ``fp4_efficiency`` of that (block-scale handling), and
memory efficiency grows with the transfer size the same way.

Attention's rows are one sequence's, because each sequence attends over its own keys: a decode step of B sequences
is B separate problems, not one of B rows. Decode kernels (FlashDecoding, FlashInfer, TRT-LLM's XQA) put the query
heads that share a KV head, times the sequence's query tokens (1, or 1 + drafts under MTP), on the MMA's rows: Llama
3 70B's 8 (64 / 8 KV heads), DeepSeek's absorbed MLA 128 / tp (every head shares the latent); a KV head replicated
under tp > KV heads keeps q / tp. A prefill's rows are its prompt's tokens. (Until 2026-12-07 the rows were the
step's decode tokens: at batch 1 that made a GQA model's decode attention compute-bound at ~1 / 65 of peak, several
times its KV reads.)

Grouped MoE GEMMs use eff = e_max x (rows + floor) / (rows + floor + rows_half), rows = routed rows per touched
expert. The plain curve charges every touched expert a fixed rows_half / e_max rows' worth of compute however few
rows it gets: fitted where the calibration data has MoE steps (5-1000 rows per expert) that is its shape, but at
the 1-3 rows per expert of a big MoE model at high interactivity it made DeepSeek-R1's expert GEMMs compute-bound at
3-7x their weight-read time. Engines run such steps with small-M kernels (vLLM's fused_moe picks BLOCK_SIZE_M = 16
at small batch; swap-AB and DeepGEMM's masked low-latency kernels) that stream the experts' weights; with the floor,
below ~floor rows the compute shrinks with the rows and the weight reads (the memory term) bound the kernel.
``moe_rows_floor`` = 16 is that smallest tile (an assumption, not fitted: no calibration row has < 5 rows per
expert). Adding it moved the refit's median |error| 10.8% -> 8.0% and leave-one-model-out 32.3% -> 27.5% (the
calibration of 2026-12-04; docs/fidelity.md has the current figures). The fixed cost is compute at the kernel's math
rate: charged as streams of the expert's weights instead it fitted the file better in sample but predicted held-out
models worse (gpt-oss-20b's Hopper W4A16 rows, BF16 math, +19..+60% from the other models' MoE rows, FP4 / FP8
math; docs/fidelity.md, 2026-12-06).

GEMM and grouped-expert kernels also lose efficiency with a shallow contraction: eff x K / (K + k_half) with K the
kernel's FLOP-weighted (harmonic) mean contraction depth per chip. A tiled GEMM pays each output tile's pipeline
fill and epilogue (loading the first K-slabs, converting and writing the accumulator) once, however deep its K loop
runs, so at a fixed row count a shallow K reaches a smaller share of peak; tensor parallelism makes it shallower for
the row-parallel layers (o_proj, down projections: K / tp per chip). Fitted (``gemm_k_half``, docs/fidelity.md):
without it the calibration over-predicted the shallow-K model (Qwen3-30B-A3B, 2048 wide with 768-wide experts) and
some of Llama 3 70B's tp8 rows.

A step adds its collectives (ring / tree all-reduce, all-to-all, p2p; ``serving/collectives.py``), overlapped with
compute by ``comm_overlap``, and a fixed step overhead. Weights and KV that fit in on-chip SRAM stream from it
(placement: the step's resident bytes share the SRAM pro rata).

Parallel mapping (vectorisable floats): ``tp`` tensor parallel inside an attention replica, ``dp`` attention data
parallel replicas, ``ep`` expert parallel ranks over the tp x dp chips of a stage, ``pp`` pipeline stages.
Attention-side and dense-FFN kernels split their weights and the busiest replica's work over tp. A request lives on
one replica, so one prompt, or B < dp sequences, keeps the other replicas idle while every rank waits at the
experts' all-to-all. MLA's q_a / kv_a down-projections are held whole by every TP rank
(``kernel_table._TP_REPLICATED_OPS``). KV heads split over min(tp, KV heads) (MLA's shared latent does not split);
routed experts shard over all tp x dp chips, the busiest EP rank setting the pace: its share of the tokens' FLOPs
(``routing.ep_imbalance``) and of the touched experts' weights (``routing.busiest_rank_experts``). The power
model (``power_capped``) caps sustained power at the rating by slowing the clock of the whole step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from arch_space.chip import ENERGY_PER_FLOP_RELATIVE, Chip
from arch_space.errors import ConfigError
from arch_space.validation import build, quantity
from serving.collectives import allreduce_time, ep_alltoall_time
from serving.graph_parallel import experts_alltoall
from serving.kernel_table import GROUP_ATTENTION, GROUP_EXPERTS, KIND_ATTENTION, KIND_GEMM, KIND_MOE, \
    KernelTable
from serving.precision import MATH_DTYPES
from serving.routing import busiest_rank_experts, ep_imbalance, expected_experts

# parameters that are fractions (validated <= 1; codesign.calibrate fits them through a logistic)
FRACTIONS = ("gemm_efficiency_max", "attention_efficiency_max", "moe_efficiency_max", "fp4_efficiency",
             "memory_efficiency_max", "link_efficiency", "comm_overlap", "hbm_reserve_fraction")


@dataclasses.dataclass(frozen=True)
class ServingParams:
    """Named efficiency and overhead parameters (a pytree: calibrated by gradient descent, see conf/serving)."""
    gemm_efficiency_max: float = quantity(default=0.75)
    gemm_rows_half: float = quantity(default=32.0)
    attention_efficiency_max: float = quantity(default=0.6)
    attention_rows_half: float = quantity(default=16.0)  # query rows of one sequence (kernel_times)
    moe_efficiency_max: float = quantity(default=0.6)
    moe_rows_half: float = quantity(default=64.0)
    # rows per expert below which the grouped expert GEMMs stop paying the fitted small-M penalty as a fixed cost per
    # expert (small-M tiles / weight streaming): their compute then shrinks with the rows and the weight reads bound
    # them (module docstring; allow_zero: 0 is the plain curve)
    moe_rows_floor: float = quantity(allow_zero=True, default=16.0)
    # contraction depth at which a GEMM reaches half its row curve's efficiency: eff x K / (K + k_half) (module
    # docstring; allow_zero: 0 is no depth term, the in-code default; conf/serving/default.yaml starts the fit)
    gemm_k_half: float = quantity(allow_zero=True, default=0.0)
    # block-scaled FP4 math (NVFP4 / MXFP4) reaches this share of the efficiency FP8 reaches at the same shape:
    # its scale factors are loaded and applied per 16 / 32-element block, and the doubled peak needs twice the
    # operand feed (1.0 = no discount; applies only where the chip has native FP4 math)
    fp4_efficiency: float = quantity(default=1.0)
    memory_efficiency_max: float = quantity(default=0.85)
    memory_bytes_half: float = quantity(default=2.0e6)
    link_efficiency: float = quantity(default=0.8)
    kernel_overhead_s: float = quantity(allow_zero=True, default=4.0e-6)
    collective_overhead_s: float = quantity(allow_zero=True, default=0.0)  # per collective call (launch + sync)
    step_overhead_s: float = quantity(allow_zero=True, default=2.0e-4)
    comm_overlap: float = quantity(allow_zero=True, default=0.5)
    hbm_reserve_fraction: float = quantity(allow_zero=True, default=0.1)

    @classmethod
    def from_dict(cls, data, path: str = "serving") -> "ServingParams":
        # a calibrated file carries its fit report under `fit` (data, per-row errors) and per-vendor-family sets
        # under `families` (ParamSet below): neither is a parameter of this set
        p = build(cls, data, path, ignore=("fit", "families", "unmeasured_family"))
        for f in FRACTIONS:
            if getattr(p, f) > 1:
                raise ConfigError(f"{path}.{f}", f"must be <= 1 (a fraction), got {getattr(p, f)}")
        if p.hbm_reserve_fraction >= 1:  # all of the HBM reserved: nothing left for weights or KV, every point fails
            raise ConfigError(f"{path}.hbm_reserve_fraction", f"must be < 1, got {p.hbm_reserve_fraction}")
        return p


jax.tree_util.register_dataclass(ServingParams, data_fields=[f.name for f in dataclasses.fields(ServingParams)],
                                 meta_fields=[])


def family_of(vendor: str | None) -> str:
    """The vendor family a chip's serving parameters come from: its vendor, case-folded ("NVIDIA" -> "nvidia")."""
    return (vendor or "").strip().lower()


@dataclasses.dataclass(frozen=True)
class ParamSet:
    """Serving parameters per vendor family (the calibration issue allows one set per family): a ``shared`` set
    for chips of families without their own (candidate designs, vendors with no measurements) and fitted sets for
    the families in ``families`` (conf/serving/calibrated.yaml: a family lists only the values it overrides).

    ``unmeasured_family`` (a config key, null by default) makes a fitted family's set the one chips without their
    own use: how mature the software of a chip never measured will be is an assumption (cross-validation on the
    calibration file: with AMD held out, the set fitted on NVIDIA put MI355X +250..+880% too high), and this is its
    knob: ``serving.unmeasured_family=nvidia`` or ``=amd`` against the shared set in between."""
    shared: ServingParams
    families: tuple[tuple[str, ServingParams], ...] = ()

    def for_vendor(self, vendor: str | None) -> ServingParams:
        return dict(self.families).get(family_of(vendor), self.shared)

    @classmethod
    def from_dict(cls, data, path: str = "serving") -> "ParamSet":
        shared = ServingParams.from_dict(data, path)
        fams = (data or {}).get("families") or {}
        if not isinstance(fams, dict):
            raise ConfigError(f"{path}.families", f"expected a mapping of vendor families to parameters, got {fams!r}")
        base = {k: v for k, v in data.items() if k not in ("fit", "families", "unmeasured_family")}
        out = []
        for name, over in sorted(fams.items()):
            if not isinstance(over, dict):
                raise ConfigError(f"{path}.families.{name}", f"expected a mapping of parameters, got {over!r}")
            if family_of(name) != name:
                raise ConfigError(f"{path}.families.{name}", "family names are lower-case vendor names")
            out.append((name, ServingParams.from_dict(base | over, f"{path}.families.{name}")))
        unmeasured = (data or {}).get("unmeasured_family")
        if unmeasured is not None:
            known = dict(out)
            if unmeasured not in known:
                raise ConfigError(f"{path}.unmeasured_family", f"no fitted family {unmeasured!r} (fitted: "
                                                               f"{', '.join(known) or 'none'}; null: the shared set)")
            shared = known[unmeasured]
        return cls(shared, tuple(out))


@dataclasses.dataclass(frozen=True)
class Mapping:
    """A parallel mapping as floats (so a list of mappings is one pytree of arrays)."""
    tp: float = 1.0
    dp: float = 1.0
    ep: float = 1.0
    pp: float = 1.0

    @property
    def chips(self):
        return self.tp * self.dp * self.pp


jax.tree_util.register_dataclass(Mapping, data_fields=["tp", "dp", "ep", "pp"], meta_fields=[])


# ---------------------------------------------------------------------------------------------- helpers
def causal_pairs(t, cap):
    """(query, key) pairs of a causal prefill of t tokens with a key window ``cap``: sum_i min(i, cap)."""
    return jnp.where(cap >= t, 0.5 * t * t, t * cap - 0.5 * cap * cap)


@dataclasses.dataclass(frozen=True)
class Work:
    """What one step asks of the kernels (floats, traced): decode tokens at a context, prefill tokens of requests
    of a given length, and the tokens that pass through the routed experts and the collectives."""
    decode_tokens: object  # B sequences decoding (x (1 + draft) query tokens each under speculation)
    decode_queries: object  # query tokens per decoding sequence (1, or 1 + draft length)
    context: object  # mean context of the decoding sequences
    prefill_requests: object  # requests whose prefill runs in this step (may be fractional: chunked prefill)
    prefill_len: object  # tokens per prefilled request


def kernel_times(chip: Chip, kt: KernelTable, p: ServingParams, m: Mapping, w: Work, clock=1.0):
    """Per-kernel time on one chip [K], plus the per-step totals the power model and reports need. ``clock`` < 1
    scales the math rates down (power-capped clock)."""
    n_stage = m.tp * m.dp
    q_tokens = w.decode_tokens * w.decode_queries
    pre_tokens = w.prefill_requests * w.prefill_len
    tokens = q_tokens + pre_tokens
    ctx = jnp.minimum(w.context, kt.ctx_cap)  # [K]
    pairs = causal_pairs(w.prefill_len, kt.ctx_cap)  # [K]
    # Attention-DP replicas each hold their own sequences and wait for the busiest one at every layer's expert
    # all-to-all, so the non-expert kernels run the busiest replica's share: max(x / dp, min(x, 1)) sequences or
    # prompts, since a lone request lives whole on one replica (exact on power-of-two batches; dp = 1: all of x).
    # The routed experts see every replica's tokens.
    dec_r = jnp.maximum(w.decode_tokens / m.dp, jnp.minimum(w.decode_tokens, 1.0))
    req_r = jnp.maximum(w.prefill_requests / m.dp, jnp.minimum(w.prefill_requests, 1.0))
    q_r, pre_r = dec_r * w.decode_queries, req_r * w.prefill_len
    tokens_r = q_r + pre_r

    def step_flops(q, req, pre):  # matmul FLOPs by dtype [K, D] of q decode query tokens and req prompts
        dec = kt.d_flops_b * q + kt.d_flops_bc * (q * ctx)[:, None]
        return dec, dec + kt.p_flops_r * req + kt.p_flops_t * pre + kt.p_flops_tt * (req * pairs)[:, None]

    is_exp = kt.group == GROUP_EXPERTS
    flops_dec_all, flops_all = step_flops(q_tokens, w.prefill_requests, pre_tokens)
    flops_dec_r, flops_r = step_flops(q_r, req_r, pre_r)
    flops_dec = jnp.where(is_exp[:, None], flops_dec_all, flops_dec_r)
    flops = jnp.where(is_exp[:, None], flops_all, flops_r)  # the experts' whole step, the busiest replica's elsewhere
    touched = expected_experts(kt.num_experts, kt.experts_per_token, tokens)
    imbalance = jnp.where(is_exp, ep_imbalance(tokens, kt.experts_per_token, m.ep), 1.0)
    tp_k = jnp.where(kt.tp_replicated > 0, 1.0, m.tp)  # the TP ranks a kernel's weights and work split over
    per_chip = jnp.where(is_exp, imbalance / n_stage, 1.0 / tp_k)  # experts shard over the stage, the rest over tp
    flops_chip = flops * per_chip[:, None]
    native_fp4 = jnp.where(chip.fp4_flops_per_s > 0, p.fp4_efficiency, 1.0)
    rates = jnp.stack([chip.math_rate(dt) * (native_fp4 if dt == "fp4" else 1.0) for dt in MATH_DTYPES]) * clock
    # GEMM rows: the step's tokens, except that a per-request kernel (the lm_head) sees one row per prefill
    per_request = (jnp.sum(kt.p_flops_r, axis=1) > 0) & (jnp.sum(kt.p_flops_t + kt.p_flops_tt, axis=1) == 0)
    gemm_rows = q_r + jnp.where(per_request, req_r, pre_r)  # the busiest replica's
    rows = jnp.where(is_exp, tokens * kt.experts_per_token / jnp.maximum(touched, 1e-9), gemm_rows)
    e_max = jnp.where(kt.kind == KIND_MOE, p.moe_efficiency_max,
                      jnp.where(kt.kind == KIND_ATTENTION, p.attention_efficiency_max, p.gemm_efficiency_max))
    half = jnp.where(kt.kind == KIND_MOE, p.moe_rows_half,
                     jnp.where(kt.kind == KIND_ATTENTION, p.attention_rows_half, p.gemm_rows_half))
    # t / eff with eff = e_max (rows + floor) / (rows + floor + half), written so that a kernel without work costs
    # exactly 0; the floor is the grouped MoE kernels' only (module docstring), 0 for every other kind
    floor = jnp.where(kt.kind == KIND_MOE, p.moe_rows_floor, 0.0)
    t_peak = jnp.sum(flops_chip / rates, axis=1)  # every FLOP at its dtype's peak rate
    t_compute = t_peak / e_max * (1.0 + half / jnp.maximum(rows + floor, 1e-6))
    # attention: each sequence attends over its own keys, so its rows are that sequence's queries, never the batch's
    # (module docstring): a decode step's query heads sharing one KV head on the chip times its query tokens, a
    # prefill's prompt tokens
    group = kt.query_heads / jnp.maximum(kt.kv_split_limit, m.tp)
    t_dec = jnp.sum(flops_dec * per_chip[:, None] / rates, axis=1)
    t_attn = (t_dec * (1.0 + half / jnp.maximum(w.decode_queries * group, 1e-6))
              + (t_peak - t_dec) * (1.0 + half / jnp.maximum(w.prefill_len, 1e-6)))
    t_compute = jnp.where(kt.kind == KIND_ATTENTION, t_attn / e_max, t_compute)
    # contraction depth: GEMM and grouped-expert kernels also run at K / (K + k_half) of the row curve (module
    # docstring), with the FLOP-weighted mean 1 / K per chip: row-parallel weights split K over tp (dense), or over
    # the chips sharing each expert (n_stage / ep: experts that EP does not spread whole are TP-sharded)
    split = jnp.where(is_exp, jnp.maximum(n_stage / m.ep, 1.0), tp_k)
    f_dec = jnp.sum(flops_dec, axis=1)
    f_all = jnp.sum(flops, axis=1)
    inv_k = (f_dec * (kt.d_inv_k + kt.d_inv_k_row * split)
             + (f_all - f_dec) * (kt.p_inv_k + kt.p_inv_k_row * split)) / jnp.maximum(f_all, 1e-30)
    is_gemm = (kt.kind == KIND_GEMM) | (kt.kind == KIND_MOE)
    t_compute = t_compute * (1.0 + jnp.where(is_gemm, p.gemm_k_half * inv_k, 0.0))
    # bytes per chip
    # routed experts: the busiest EP rank's touched experts, each split over the n_stage / ep chips sharing it
    busiest = busiest_rank_experts(kt.num_experts, kt.experts_per_token, tokens, m.ep)
    weights = jnp.where(is_exp, busiest * m.ep / (kt.num_experts * n_stage) * kt.expert_weight_bytes,
                        kt.weight_bytes / tp_k)
    # KV lives with its sequence's replica: the busiest one's, its heads split over min(tp, KV heads)
    kv = (kt.d_kv_read_bc * dec_r * ctx + kt.kv_write_b * tokens_r) / jnp.minimum(m.tp, kt.kv_split_limit)
    act = jnp.where(is_exp, (kt.d_act_b * q_tokens + kt.p_act_r * w.prefill_requests + kt.p_act_t * pre_tokens)
                    / n_stage, (kt.d_act_b * q_r + kt.p_act_r * req_r + kt.p_act_t * pre_r) / tp_k)
    resident = weights + kv
    total_resident = jnp.sum(resident * kt.count)
    # explicit placement pins a pro-rata share of the resident bytes; a cache serves them only when they all fit
    fits = jnp.where(total_resident <= chip.sram_capacity_bytes, 1.0, 0.0)
    x = chip.sram_explicit_fraction
    share = x * jnp.minimum(1.0, chip.sram_capacity_bytes / jnp.maximum(total_resident, 1.0)) + (1.0 - x) * fits
    s_bw, h_bw = chip.sram_bandwidth_bytes_per_s, chip.hbm_bandwidth_bytes_per_s
    moved = resident + act
    on_chip = jnp.minimum(share * resident, moved * s_bw / (s_bw + h_bw))
    t_stream = jnp.maximum(on_chip / s_bw, (moved - on_chip) / h_bw)
    t_memory = t_stream / p.memory_efficiency_max * (1.0 + p.memory_bytes_half / jnp.maximum(moved, 1e-6))
    t = jnp.maximum(t_compute, t_memory) + p.kernel_overhead_s
    # collectives of the step: TP all-reduces inside the scale-up domain; EP all-to-all hierarchical when the EP
    # group spans several scale-up domains (large EP over nodes, as the lmsys DeepSeek deployments). Under
    # attention-DP the dense FFN and shared expert run data-parallel (serving/graph_parallel.py): no DP collective.
    link, lat = chip.scaleup_bandwidth_bytes_per_s * p.link_efficiency, chip.scaleup_latency_s
    out_link = chip.scaleout_bandwidth_bytes_per_s * p.link_efficiency
    out_lat = 5.0 * lat  # a scale-out hop: NIC + switch tiers (assumed 5x a scale-up hop)
    msg = tokens_r * kt.hidden_size * kt.activation_bytes  # a TP group all-reduces its replica's tokens
    # every collective call also pays a fixed launch + synchronisation cost (NCCL-class small-message latency)
    call = p.collective_overhead_s
    # Tokens reach the experts by all-to-all only under attention-DP (dp > 1: each replica holds different tokens;
    # DeepEP, SGLang's dp-attention, TRT-LLM's attention-DP). Without it every rank of the TP group already holds
    # all the step's tokens after the attention all-reduce, so experts sharded by TP (ep = 1) or by EP over the TP
    # group (tpNepN: vLLM's --enable-expert-parallel without DP, TRT-LLM's moe_expert_parallel_size under attention
    # TP) compute on the local copy and an all-reduce sums their partial outputs, as Megatron's second all-reduce:
    # a MoE layer without a shared expert reduces its experts' output on its own, with one the shared buffer does
    a2a = experts_alltoall(m.ep, m.dp)
    has_ar = jnp.where(a2a, kt.tp_allreduce, kt.tp_allreduce_ep1)
    t_ar = has_ar * (allreduce_time(msg, m.tp, link, lat) + jnp.where(m.tp > 1.0, call, 0.0))
    # dispatch quantised where the experts take FP8 / FP4 activations, combine at the activations' size (DeepSeek-V3
    # report sec. 3.3.2; DeepEP; serving.precision.DISPATCH_BYTES_QUANTISED)
    local = tokens_r / m.tp  # what each rank of the busiest replica dispatches
    a2a_bytes = jnp.where(a2a, local * kt.experts_per_token * kt.hidden_size
                          * (kt.dispatch_bytes + kt.activation_bytes) * (m.ep - 1) / m.ep, 0.0)

    def one_way(elem_bytes):
        return ep_alltoall_time(local, kt.experts_per_token, m.ep, chip.scaleup_domain_chips,
                                kt.hidden_size * elem_bytes, link, lat, out_link, out_lat) + call

    t_a2a = kt.ep_alltoall * jnp.where(a2a, one_way(kt.dispatch_bytes) + one_way(kt.activation_bytes), 0.0)
    t_comm = t_ar + t_a2a
    n = kt.count
    flops_by_dtype = jnp.sum(flops_chip * n[:, None], axis=0)
    link = has_ar * msg * 2.0 * (m.tp - 1) / m.tp + kt.ep_alltoall * a2a_bytes
    return {"t": t, "t_compute": t_compute, "t_memory": t_memory, "t_comm": t_comm,
            "flops_by_dtype": flops_by_dtype, "hbm_bytes": jnp.sum((moved - on_chip) * n),
            "sram_bytes": jnp.sum(on_chip * n), "link_bytes": jnp.sum(link * n)}


def micro_batch(m: Mapping, w: Work) -> Work:
    """Per chip, one iteration of a pipeline-parallel mapping is the whole layer stack at one micro-batch's work.

    Under pp stages the B decoding sequences run as mb = min(B, pp) micro-batches, one per stage at a time (GPipe,
    Huang et al. 2019; Megatron-LM's PP, Narayanan et al. 2021): an iteration (every sequence one token) is pp
    stage-steps on each chip, each over L / pp layers at B / mb sequences, so each chip runs L layer-passes at
    B / mb sequences, reading its stage's weights once per micro-batch (W / tp in all, as without PP) and doing
    1 / mb of the FLOPs. With B < pp stages idle while one sequence passes through the others (the stack at one
    sequence); with pp = 1 the work is unchanged. A prefill carried by the step splits the same way."""
    mb = jnp.clip(w.decode_tokens, 1.0, m.pp)
    return dataclasses.replace(w, decode_tokens=w.decode_tokens / mb, prefill_requests=w.prefill_requests / mb)


def step_time(chip: Chip, kt: KernelTable, p: ServingParams, m: Mapping, w: Work, clock=1.0):
    """One iteration on the mapping: kernels (layers split over pp stages, :func:`micro_batch`), collectives
    overlapped by ``comm_overlap``, PP send/recv, step overhead. Returns (seconds, details)."""
    w = micro_batch(m, w)
    kt_out = kernel_times(chip, kt, p, m, w, clock)
    t_cm = jnp.sum(kt_out["t"] * kt.count)
    t_comm = jnp.sum(kt_out["t_comm"] * kt.count)
    overlapped = t_cm + t_comm - p.comm_overlap * jnp.minimum(t_cm, t_comm)
    tokens = w.decode_tokens * w.decode_queries + w.prefill_requests * w.prefill_len
    p2p = (m.pp - 1.0) * (tokens * kt.hidden_size * kt.activation_bytes
                          / (chip.scaleup_bandwidth_bytes_per_s * p.link_efficiency) + chip.scaleup_latency_s)
    kt_out["t_draft_layer"] = jnp.sum(kt_out["t"] * kt.draft_count)
    kt_out["t_p2p"] = p2p
    return overlapped + p2p + p.step_overhead_s, kt_out


def step_energy(chip: Chip, kt_out: dict):
    """Dynamic energy of a step: FLOPs x energy per FLOP of the format they run in (the math-rate fallback) + HBM
    and SRAM bytes x energy per byte + link bytes x energy per byte (per chip)."""
    e_flop = jnp.stack([chip.executed_energy_per_flop(dt) for dt in MATH_DTYPES])
    return (jnp.sum(kt_out["flops_by_dtype"] * e_flop) + kt_out["hbm_bytes"] * chip.hbm_energy_j_per_byte
            + kt_out["sram_bytes"] * chip.sram_energy_j_per_byte + kt_out["link_bytes"] * chip.link_energy_j_per_byte)


def power_capped(chip: Chip, kt_out: dict, seconds):
    """Sustained power = static + dynamic energy / time, capped at the rating by slowing the clock: a step can
    take no less than dynamic energy / (rating - static) (DVFS trades frequency for power at fixed energy per
    operation, a first-order model). Returns (seconds, watts, clock factor = unconstrained / capped time)."""
    energy = step_energy(chip, kt_out)
    t_power = energy / (chip.power_rating_w - chip.idle_power_w)
    t = jnp.maximum(seconds, t_power)
    return t, chip.idle_power_w + energy / t, seconds / t


__all__ = ["ServingParams", "ParamSet", "family_of", "Mapping", "Work", "kernel_times", "step_time", "power_capped",
           "step_energy", "ENERGY_PER_FLOP_RELATIVE", "GROUP_ATTENTION",
           "KIND_GEMM"]
