"""From traced operator graphs to a table of per-kernel cost coefficients that the serving model evaluates.

The operator graph (``serving/graph.py``) prices one traced step at one (batch, context). The serving model needs
every kernel's cost as a function of the batch B and the context C, for every concurrency at once, inside ``jit``
and ``vmap``. Every quantity a transformer kernel has is affine in B, B x C (decode) or T, T^2 (prefill of T
tokens), so :func:`build_kernel_table` traces a few full-size steps of the real model and solves for those
coefficients per kernel:

    decode  q(B, C) = q_B x B + q_BC x B x C        from traces at (B, C) = (1, C0), (2, C0), (1, 2 C0)
    prefill q(T)    = q_R + q_T x T + q_TT x T^2    from traces of one request at T = T0, 2 T0, 4 T0

for matmul FLOPs by math dtype, KV bytes read and written and activation bytes. Each kernel's GEMMs also carry their
FLOP-weighted mean 1 / K (contraction depth), apart for row-parallel weights (whose K tensor parallelism splits)
and the rest, from the decode and the prefill traces (K is a weight's width, the same at every B, C and T; MLA runs
different products in its absorbed decode and its prefill). The per-request term q_R is the
lm_head of a prompt, which serving engines run on its last position only (the models' ``prefill`` does the same).
Weight bytes are constant per step
(routed experts scale at evaluation with the expected experts touched). The model code computes attention over the
whole masked cache; real kernels skip masked blocks, so the evaluator caps sliding-window and chunked layers at
their window (``ctx_cap``) and halves the causal T^2 term (FlashAttention-2's causal block skipping, Dao 2023).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np

from serving.graph import trace_step
from serving.graph_parallel import ParallelMapping
from serving.precision import MATH_DTYPES, RECIPE_CLASS, Precision

KIND_GEMM, KIND_ATTENTION, KIND_MOE, KIND_VECTOR = 0, 1, 2, 3
GROUP_ATTENTION, GROUP_FFN, GROUP_EXPERTS = 0, 1, 2
_KIND = {"matmul": KIND_GEMM, "lm_head": KIND_GEMM, "router": KIND_GEMM, "embed": KIND_VECTOR,
         "attention": KIND_ATTENTION, "moe_experts": KIND_MOE}
_FFN_OPS = ("mlp", "shared_expert")
# Kernels whose weights every TP rank holds whole: MLA's down-projections from the hidden state to the compressed
# query and KV latents (DeepSeek-V3 / Kimi K2.5 wq_a and wkv_a, 7168 -> 1536 and 7168 -> 576): vLLM and SGLang
# build them as ReplicatedLinear (fused as fused_qkv_a_proj_with_mqa), since their narrow outputs feed a norm and
# the attention of every head; they do the whole replica's work on every rank.
_TP_REPLICATED_OPS = ("q_a_proj", "kv_a_proj")
DECODE_C0 = 1024
PREFILL_T0 = 256


@dataclasses.dataclass(frozen=True)
class KernelTable:
    """Per-kernel coefficients (arrays of shape [K], FLOP arrays [K, len(MATH_DTYPES)])."""
    kind: np.ndarray
    group: np.ndarray
    layer: np.ndarray  # -1 outside the layer stack
    d_flops_b: np.ndarray  # decode matmul FLOPs per token, by dtype
    d_flops_bc: np.ndarray  # ... per token per context position
    p_flops_r: np.ndarray  # prefill matmul FLOPs per prefilled request (the lm_head on its last position)
    p_flops_t: np.ndarray  # prefill matmul FLOPs per token
    p_flops_tt: np.ndarray  # ... per token^2 (full masked square as traced)
    weight_bytes: np.ndarray  # non-routed weight bytes read per step
    expert_weight_bytes: np.ndarray  # all routed experts of the kernel (scaled by touched / E when evaluated)
    d_kv_read_bc: np.ndarray  # KV bytes read per token per context position
    kv_write_b: np.ndarray  # KV bytes written per new token
    d_act_b: np.ndarray  # activation bytes in + out per token (decode)
    p_act_r: np.ndarray  # ... per prefilled request
    p_act_t: np.ndarray  # ... per prefill token
    d_inv_k: np.ndarray  # FLOP-weighted mean 1 / K of the decode step's products with weights whose K is not split
    d_inv_k_row: np.ndarray  # ... with row-parallel weights (K / tp per chip; serving/graph.ROW_PARALLEL_KEYS)
    p_inv_k: np.ndarray  # ... of the prefill
    p_inv_k_row: np.ndarray
    ctx_cap: np.ndarray  # window / chunk of sliding or chunked attention, else a large number
    tp_allreduce: np.ndarray  # 1.0 where a TP all-reduce follows the kernel (experts all-to-all: EP + attention-DP)
    tp_allreduce_ep1: np.ndarray  # ... when the experts see every token (ep = 1, or tpNepN): their partial sums too
    ep_alltoall: np.ndarray  # 1.0 on the routed-experts kernels (dispatch + combine under EP with attention-DP)
    tp_replicated: np.ndarray  # 1.0 where every TP rank holds the weights whole and does the work (_TP_REPLICATED_OPS)
    draft_count: np.ndarray  # how many of the ``count`` kernels one MTP draft step runs (last layer + lm_head)
    count: np.ndarray  # identical kernels merged into this row (the same kernel of every layer of one kind)
    hidden_size: float
    num_layers: float
    num_experts: float
    experts_per_token: float
    kv_split_limit: float  # TP degree beyond which the KV cache is replicated (KV heads; 1 for MLA's latent)
    query_heads: float  # attention query heads (a decode step's query rows per KV head: query_heads / KV heads)
    weight_bytes_total: float  # every resident weight (for memory feasibility)
    activation_bytes: float
    dispatch_bytes: float  # per element of a token sent to the experts by EP all-to-all (Precision.dispatch_bytes)
    names: tuple = ()  # static

    @property
    def num_kernels(self) -> int:
        return len(self.kind)


_DATA = [f.name for f in dataclasses.fields(KernelTable) if f.name != "names"]
jax.tree_util.register_dataclass(KernelTable, data_fields=_DATA, meta_fields=["names"])


def _flops_vec(k) -> np.ndarray:
    return np.asarray([k.flops_by_math_dtype.get(dt, 0.0) for dt in MATH_DTYPES], dtype=np.float64)


def _kv_cap(arch, layer: int | None) -> float:
    if layer is None or layer < 0:
        return 1e12
    kind = arch.layer_kinds()[layer].attention
    if kind == "sliding" and arch.sliding_window:
        return float(arch.sliding_window)
    if kind == "chunked" and arch.attention_chunk_size:
        return float(arch.attention_chunk_size)
    return 1e12


def _aligned(*graphs):
    """Kernel names over all graphs, in first-seen order (prefill and decode may differ: MLA's un-absorbed prefill
    and absorbed decode run different kernels); a graph without a kernel contributes zeros for it."""
    names: list = []
    for g in graphs:
        for k in g.kernels:
            if k.name not in names:
                names.append(k.name)
    return tuple(names)


def _by_name(graph, names):
    from serving.graph import Kernel

    have = {k.name: k for k in graph.kernels}
    return [have.get(n) or Kernel(name=n, layer=None, kind="other") for n in names]


_TABLES: dict = {}


def _cached_table(arch, precision: Precision) -> KernelTable:
    key = (arch, json.dumps(dataclasses.asdict(precision), sort_keys=True))
    if key not in _TABLES:
        _TABLES[key] = _trace_table(arch, precision)
    return _TABLES[key]


def _trace_table(arch, precision: Precision) -> KernelTable:
    from serving.models import build_model

    model = build_model(arch)
    # to learn where collectives sit: TP inside an attention replica, and for MoE the experts' all-to-all, which
    # needs attention-DP (tp2 x 2 replicas, ep4; serving/graph_parallel.py)
    ref = ParallelMapping(tp=2, ep=4, dp_attention=2) if arch.num_experts else ParallelMapping(tp=2)
    dec = {(b, c): trace_step(model, arch, "decode", b, 1, c, precision, mapping=ref)
           for b, c in ((1, DECODE_C0), (2, DECODE_C0), (1, 2 * DECODE_C0))}
    # ... and where they sit when the experts see every token (tpN with ep = 1, or tpNepN): their output is a
    # partial sum that needs its own all-reduce unless a shared expert's (summed into the same buffer) already takes
    # it (a re-pricing of the cached trace, no new trace)
    tp_only = trace_step(model, arch, "decode", 1, 1, DECODE_C0, precision, mapping=ParallelMapping(tp=2))
    t_pre = (PREFILL_T0, 2 * PREFILL_T0, 4 * PREFILL_T0)
    pre = {t: trace_step(model, arch, "prefill", 1, t, t, precision) for t in t_pre}
    names = _aligned(*dec.values(), *pre.values())
    g11, g21, g12 = dec[(1, DECODE_C0)], dec[(2, DECODE_C0)], dec[(1, 2 * DECODE_C0)]
    vander = np.asarray([[1.0, t, float(t) * t] for t in t_pre])
    rows = []
    cols_k = [_by_name(g, names) for g in (g11, g21, g12, *(pre[t] for t in t_pre), tp_only)]
    for i, name in enumerate(names):
        a, b, c, q1, q2, q4, a_tp = (col[i] for col in cols_k)
        if a.kind == "other" and a.layer is None:  # a prefill-only kernel: take its identity from the prefill
            a = dataclasses.replace(q1, weight_bytes=q1.weight_bytes, comm=[])

        def decode_fit(get):
            # q(B, C) = qb B + qbc B C: the B slope at C0 and the C slope at B = 1
            slope_c = (get(c) - get(a)) / DECODE_C0
            qb = get(b) - get(a) - slope_c * DECODE_C0
            return qb, slope_c

        def prefill_fit(get):
            # q(T) = qr + qt T + qtt T^2 through the three traces (exact: three points, three unknowns)
            return np.linalg.solve(vander, np.stack([np.asarray(get(q), np.float64) for q in (q1, q2, q4)]))

        fb, fbc = decode_fit(_flops_vec)
        pr, pt, ptt = prefill_fit(_flops_vec)
        _, kv_bc = decode_fit(lambda k: k.kv_read_bytes)
        kv_w, _ = decode_fit(lambda k: k.kv_write_bytes)
        act_b, _ = decode_fit(lambda k: k.activation_in_bytes + k.activation_out_bytes)
        act_r, act_t, _ = prefill_fit(lambda k: k.activation_in_bytes + k.activation_out_bytes)
        d_inv, d_inv_row = _inv_k(a)
        p_inv, p_inv_row = _inv_k(q1)
        op = name.rsplit("/", 1)[-1]
        routed = a.weight_bytes_by_class.get("routed_experts", 0.0)
        group = GROUP_EXPERTS if a.kind == "moe_experts" else GROUP_FFN if op in _FFN_OPS else GROUP_ATTENTION
        rows.append(dict(
            kind=_KIND.get(a.kind, KIND_VECTOR), group=group, layer=-1 if a.layer is None else a.layer,
            d_flops_b=np.maximum(fb, 0), d_flops_bc=np.maximum(fbc, 0), p_flops_r=_clean(pr, pt, ptt),
            p_flops_t=np.maximum(pt, 0), p_flops_tt=np.maximum(ptt, 0), weight_bytes=a.weight_bytes - routed,
            expert_weight_bytes=routed, d_kv_read_bc=max(kv_bc, 0.0), kv_write_b=max(kv_w, 0.0),
            d_act_b=max(act_b, 0.0), p_act_r=float(_clean(act_r, act_t, 0.0)), p_act_t=max(act_t, 0.0),
            d_inv_k=d_inv, d_inv_k_row=d_inv_row, p_inv_k=p_inv, p_inv_k_row=p_inv_row,
            ctx_cap=_kv_cap(arch, a.layer) if a.kind == "attention" else 1e12,
            tp_allreduce=float(any(x.op == "all_reduce" for x in a.comm)),
            tp_allreduce_ep1=float(any(x.op == "all_reduce" for x in a_tp.comm)),
            ep_alltoall=float(any(x.op == "all_to_all" for x in a.comm)),
            tp_replicated=float(op in _TP_REPLICATED_OPS),
            # DeepSeek's MTP module is one more decoder layer (+ eh_proj) sharing the lm_head: its cost is that
            # of the last layer plus the head (eh_proj, 2h x h, is under 1% of a MoE layer and is left out)
            draft_count=float(a.layer == arch.num_layers - 1 or op == "lm_head"), count=1.0))
    rows, names = _merge(rows, names)
    cols = {k: np.asarray([r[k] for r in rows], dtype=np.float64) for k in rows[0]}
    cols["kind"] = cols["kind"].astype(np.int32)
    cols["group"] = cols["group"].astype(np.int32)
    counts = arch.param_counts()
    resident = sum(n * precision.of(_recipe(c)).bytes_per_weight for c, n in counts.items() if c != "mtp")
    return KernelTable(
        **cols, hidden_size=float(arch.hidden_size), num_layers=float(arch.num_layers),
        num_experts=float(max(arch.num_experts, 1)), experts_per_token=float(arch.experts_per_token),
        kv_split_limit=float(arch.num_kv_heads if arch.family == "gqa" else 1),
        query_heads=float(arch.num_attention_heads), weight_bytes_total=float(resident),
        activation_bytes=precision.activation_bytes, dispatch_bytes=precision.dispatch_bytes, names=names)


def _inv_k(kernel) -> tuple[float, float]:
    """(unsplit, row-parallel) FLOP-weighted mean 1 / K of a traced kernel's matmuls (0 without matmul FLOPs)."""
    f = kernel.matmul_flops
    if f <= 0:
        return 0.0, 0.0
    over = kernel.matmul_flops_over_k
    return over.get("unsplit", 0.0) / f, over.get("row_parallel", 0.0) / f


def _clean(per_request, per_token, per_token2):
    """The per-request coefficient with solver round-off removed: zero unless it exceeds 1e-6 of what the T and T^2
    terms add at T0 (a kernel that is truly per token leaves ~1e-12 relative residue in the 3x3 solve)."""
    r = np.asarray(per_request, np.float64)
    scale = np.abs(np.asarray(per_token)) * PREFILL_T0 + np.abs(np.asarray(per_token2)) * PREFILL_T0 ** 2
    return np.where(r > 1e-6 * scale, r, 0.0)


def _merge(rows: list[dict], names: tuple) -> tuple[list[dict], tuple]:
    """Merge kernels whose every coefficient is equal (e.g. o_proj of all 80 layers) into one row with a count:
    the evaluator's cost is per unique kernel, so a 61-layer model costs what its few layer kinds cost."""
    merged: dict = {}
    order = []
    for r, name in zip(rows, names):
        key = tuple((k, np.asarray(v).tobytes()) for k, v in sorted(r.items())
                    if k not in ("layer", "count", "draft_count"))
        if key not in merged:
            merged[key] = dict(r, layer=r["layer"], count=0.0, draft_count=0.0, _name=name.split("/")[-1])
            order.append(key)
        merged[key]["count"] += 1.0
        merged[key]["draft_count"] += r["draft_count"]
    out = [merged[k] for k in order]
    return [{k: v for k, v in r.items() if k != "_name"} for r in out], tuple(r["_name"] for r in out)


def _recipe(cls: str) -> str:
    return RECIPE_CLASS[cls]


def pad_kernels(kt: KernelTable, size: int) -> KernelTable:
    """``kt`` with ``size`` rows and no names: the extra rows copy the first kernel with ``count`` and
    ``draft_count`` 0, so they add exactly nothing (every per-kernel quantity the evaluator sums is weighted by the
    counts, and a copy of a real kernel keeps every intermediate finite). Tables of different models padded to one
    size share one compiled evaluator."""
    k = kt.num_kernels
    if size < k:
        raise ValueError(f"cannot pad {k} kernels to {size}")
    idx = np.concatenate([np.arange(k), np.zeros(size - k, dtype=int)])
    rows = {f: np.asarray(getattr(kt, f))[idx] for f in _DATA if np.ndim(getattr(kt, f)) >= 1}
    for f in ("count", "draft_count"):
        rows[f][k:] = 0.0
    return dataclasses.replace(kt, **rows, names=())


def build_kernel_table(arch, precision: Precision) -> KernelTable:
    """The kernel table of ``arch`` in ``precision`` (traced once per process and cached)."""
    return _cached_table(arch, precision.for_workload(arch.name))
