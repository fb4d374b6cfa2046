"""serving/graph.py: an operator graph traced from a model step, checked against closed forms.

A small hand-written two-layer model (dense layer 0, MoE layer 1 with a ``jax.lax.ragged_dot`` experts kernel) follows
the conventions of serving/models/__init__.py; every per-kernel FLOP count, weight and KV byte count is written out in
closed form here. At the end, the real models (when serving/models/gqa.py / mla.py exist) are traced at full size and
checked against ModelArchitecture's parameter counts and FLOPs per token.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from arch_space.errors import ConfigError
from conftest import load_yaml
from serving.architecture import ModelArchitecture
from serving.graph import (ParallelMapping, annotate_comm, default_param_class, expected_distinct_experts,
                           load_imbalance, price, trace_kernels, trace_step)
from serving.precision import BITS_PER_ELEMENT, Precision, TensorPrecision

# ---------------------------------------------------------------------- a toy model following the conventions
V, H, NH, KVH, D, F, E, K, FE = 64, 32, 4, 2, 8, 48, 8, 2, 16  # vocab, hidden, heads, kv heads, head dim, ...
B, S = 3, 20  # batch, cache length (= context of the decode step)
S_ = jax.ShapeDtypeStruct
BF = jnp.bfloat16


def toy_params():
    attn = {"wq": S_((H, NH * D), BF), "wk": S_((H, KVH * D), BF), "wv": S_((H, KVH * D), BF),
            "wo": S_((NH * D, H), BF)}
    dense = {"attn_norm": S_((H,), BF), "attn": attn, "ffn_norm": S_((H,), BF),
             "mlp": {"w_gate": S_((H, F), BF), "w_up": S_((H, F), BF), "w_down": S_((F, H), BF)}}
    moe = {"attn_norm": S_((H,), BF), "attn": dict(attn), "ffn_norm": S_((H,), BF),
           "router": {"w": S_((H, E), BF)},
           "experts": {"w_gate_up": S_((E, H, 2 * FE), BF), "w_down": S_((E, FE, H), BF)}}
    return {"embed": S_((V, H), BF), "layers": [dense, moe], "final_norm": S_((H,), BF), "lm_head": S_((H, V), BF)}


def toy_cache():
    return {"layers": [{"k": S_((B, S, KVH, D), BF), "v": S_((B, S, KVH, D), BF)} for _ in range(2)],
            "length": S_((), jnp.int32)}


def rms(x, w):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5)).astype(x.dtype) * w


def toy_decode(params, tokens, cache):
    b = tokens.shape[0]
    pos = cache["length"] - 1
    with jax.named_scope("embed"):
        x = params["embed"][tokens[:, 0]]  # [B, H], a gather of B rows
    new_layers = []
    for i, lp in enumerate(params["layers"]):
        with jax.named_scope(f"layer_{i}/attn_norm"):
            y = rms(x, lp["attn_norm"])
        with jax.named_scope(f"layer_{i}/qkv_proj"):
            q, k, v = y @ lp["attn"]["wq"], y @ lp["attn"]["wk"], y @ lp["attn"]["wv"]
        with jax.named_scope(f"layer_{i}/attention"):
            c = cache["layers"][i]
            kc = jax.lax.dynamic_update_slice(c["k"], k.reshape(b, 1, KVH, D), (0, pos, 0, 0))
            vc = jax.lax.dynamic_update_slice(c["v"], v.reshape(b, 1, KVH, D), (0, pos, 0, 0))
            qh = q.reshape(b, KVH, NH // KVH, D)
            s = jnp.einsum("bgrd,bsgd->bgrs", qh, kc) / float(np.sqrt(D))
            a = jnp.einsum("bgrs,bsgd->bgrd", jax.nn.softmax(s, axis=-1), vc).reshape(b, NH * D)
            new_layers.append({"k": kc, "v": vc})
        with jax.named_scope(f"layer_{i}/o_proj"):
            x = x + a @ lp["attn"]["wo"]
        with jax.named_scope(f"layer_{i}/ffn_norm"):
            y = rms(x, lp["ffn_norm"])
        if "mlp" in lp:
            with jax.named_scope(f"layer_{i}/mlp"):
                m = lp["mlp"]
                x = x + (jax.nn.silu(y @ m["w_gate"]) * (y @ m["w_up"])) @ m["w_down"]
        else:
            with jax.named_scope(f"layer_{i}/router"):
                w, idx = jax.lax.top_k(y @ lp["router"]["w"], K)
                w = jax.nn.softmax(w.astype(jnp.float32), axis=-1).astype(y.dtype)
            with jax.named_scope(f"layer_{i}/experts"):
                flat = idx.reshape(-1)
                order = jnp.argsort(flat)
                rows = y[order // K]  # [B K, H] sorted by expert
                sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
                gu = jax.lax.ragged_dot(rows, lp["experts"]["w_gate_up"], sizes)
                hdn = jax.nn.silu(gu[:, :FE]) * gu[:, FE:]
                out = jax.lax.ragged_dot(hdn, lp["experts"]["w_down"], sizes)
                out = jnp.zeros_like(out).at[order].set(out).reshape(b, K, H)
                x = x + jnp.einsum("bkh,bk->bh", out, w)
    with jax.named_scope("final_norm"):
        x = rms(x, params["final_norm"])
    with jax.named_scope("lm_head"):
        logits = x @ params["lm_head"]
    return logits[:, None, :], {"layers": new_layers, "length": cache["length"] + 1}


@pytest.fixture(scope="module")
def toy_kernels():
    return {k.name: k for k in trace_kernels(toy_decode, toy_params(), S_((B, 1), jnp.int32), toy_cache(),
                                             cache_argnums=(1,))}


def precision(name):
    return Precision.from_dict(load_yaml(f"precision/{name}.yaml"))


# ---------------------------------------------------------------------- per-kernel closed forms
def test_kernel_names_layers_and_kinds(toy_kernels):
    ks = toy_kernels
    named = [n for n in ks if n != "other"]  # "other": the position arithmetic outside any scope
    assert named[:4] == ["embed", "layer_0/attn_norm", "layer_0/qkv_proj", "layer_0/attention"]
    assert ks["other"].matmul_flops == 0 and ks["other"].weight_elements_by_class == {}
    assert ks["layer_1/experts"].kind == "moe_experts" and ks["layer_1/experts"].layer == 1
    assert (ks["layer_0/attention"].kind, ks["layer_0/mlp"].kind, ks["layer_1/router"].kind) == (
        "attention", "matmul", "router")
    assert (ks["embed"].kind, ks["lm_head"].kind, ks["final_norm"].kind, ks["embed"].layer) == (
        "embed", "lm_head", "norm", None)


def test_matmul_flops_per_kernel(toy_kernels):
    ks = toy_kernels
    expected = {
        "qkv_proj": 2 * B * H * (NH * D + 2 * KVH * D),
        "attention": 2 * 2 * B * NH * S * D,  # scores q.k and values p.v over the S cached keys
        "o_proj": 2 * B * NH * D * H,
    }
    for i in range(2):
        for op, f in expected.items():
            assert ks[f"layer_{i}/{op}"].matmul_flops == f, op
    assert ks["layer_0/mlp"].matmul_flops == 3 * 2 * B * H * F
    assert ks["layer_1/router"].matmul_flops == 2 * B * H * E
    # experts: gate_up (h -> 2 fe) and down (fe -> h) ragged_dots over B k rows, plus the combine einsum (B k h)
    assert ks["layer_1/experts"].matmul_flops == 2 * B * K * H * (2 * FE) + 2 * B * K * FE * H + 2 * B * K * H
    assert ks["layer_1/experts"].matmul_flops_by_class["routed_experts"] == 2 * B * K * H * 3 * FE
    assert ks["layer_1/experts"].ragged_rows == B * K and ks["layer_1/experts"].ragged_groups == E
    assert ks["lm_head"].matmul_flops == 2 * B * H * V
    assert ks["embed"].matmul_flops == 0
    assert ks["layer_0/attention"].matmul_flops_by_class == {"weightless": 4 * B * NH * S * D}
    assert ks["layer_0/attn_norm"].vector_flops > 0 and ks["layer_0/attn_norm"].matmul_flops == 0


def test_contraction_depths_per_kernel(toy_kernels):
    """FLOPs / K per kernel in closed form from the toy's widths: every product with a weight contributes its FLOPs
    over the dimension it contracts, under ``row_parallel`` for the output / down projections (wo, w_down), which
    Megatron-LM's TP splits along K, and under ``unsplit`` otherwise; activation x activation products (attention
    scores and values, the experts' gate-weighted combine) contribute nothing."""
    ks = toy_kernels
    assert ks["layer_0/qkv_proj"].matmul_flops_over_k == {"unsplit": 2 * B * (NH * D + 2 * KVH * D)}
    assert ks["layer_0/o_proj"].matmul_flops_over_k == {"row_parallel": 2 * B * H}
    assert ks["layer_0/mlp"].matmul_flops_over_k == {"unsplit": 2 * 2 * B * F, "row_parallel": 2 * B * H}
    assert ks["layer_1/router"].matmul_flops_over_k == {"unsplit": 2 * B * E}
    assert ks["layer_1/experts"].matmul_flops_over_k == {"unsplit": 2 * B * K * 2 * FE,
                                                          "row_parallel": 2 * B * K * H}
    assert ks["lm_head"].matmul_flops_over_k == {"unsplit": 2 * B * V}
    assert ks["layer_0/attention"].matmul_flops_over_k == {}


def test_default_row_parallel():
    from serving.graph import default_row_parallel

    def path(*keys):
        return tuple(jax.tree_util.DictKey(k) if isinstance(k, str) else jax.tree_util.SequenceKey(k) for k in keys)

    assert default_row_parallel(path("layers", 3, "attn", "wo"))
    assert default_row_parallel(path("layers", 0, "experts", "w_down"))
    assert default_row_parallel(path("layers", 0, "attn", "o_proj"))  # mla
    assert default_row_parallel(path("layers", 0, "shared", "down"))  # mla's shared expert
    assert not default_row_parallel(path("layers", 0, "attn", "wq"))
    assert not default_row_parallel(path("layers", 0, "mlp", "w_up"))
    assert not default_row_parallel(path("lm_head"))


def test_weight_elements_per_kernel(toy_kernels):
    ks = toy_kernels
    assert ks["embed"].weight_elements_by_class == {"embedding": B * H}  # B gathered rows, not the table
    assert ks["layer_0/qkv_proj"].weight_elements_by_class == {"attention": H * (NH * D + 2 * KVH * D)}
    assert ks["layer_0/o_proj"].weight_elements_by_class == {"attention": NH * D * H}
    assert ks["layer_0/attn_norm"].weight_elements_by_class == {"norms": H}
    assert ks["layer_0/mlp"].weight_elements_by_class == {"dense_ffn": 3 * H * F}
    assert ks["layer_1/router"].weight_elements_by_class == {"router": H * E}
    assert ks["layer_1/experts"].weight_elements_by_class == {"routed_experts": E * 3 * H * FE}  # all experts
    assert ks["lm_head"].weight_elements_by_class == {"lm_head": H * V}
    assert ks["layer_0/attention"].weight_elements_by_class == {}
    # traced bytes: BF16 leaves
    assert ks["layer_0/mlp"].weight_bytes == 3 * H * F * 2


def test_kv_bytes(toy_kernels):
    for i in range(2):
        a = toy_kernels[f"layer_{i}/attention"]
        assert a.kv_read_elements == 2 * B * S * KVH * D  # K and V cache, whole slice
        assert a.kv_write_elements == 2 * B * 1 * KVH * D  # one new token's K and V
        assert a.kv_read_bytes == 2 * a.kv_read_elements and a.kv_write_bytes == 2 * a.kv_write_elements
    assert sum(k.kv_read_elements for k in toy_kernels.values()) == 2 * 2 * B * S * KVH * D


def test_activation_crossings(toy_kernels):
    ks = toy_kernels
    assert ks["lm_head"].activation_out_bytes == B * V * 2  # the logits leave the step
    assert ks["layer_0/qkv_proj"].activation_out_bytes == B * (NH + 2 * KVH) * D * 2  # q, k, v to attention
    assert ks["layer_0/o_proj"].activation_in_bytes >= B * NH * D * 2
    assert ks["embed"].activation_in_bytes == B * 4  # the int32 token ids


def test_price_bytes_and_math_dtypes(toy_kernels):
    fp4 = precision("fp4")  # attention fp8, FFN / experts mxfp4 + fp4 math, embeddings bf16, KV fp8
    ks = {k.name: k for k in price(list(toy_kernels.values()), fp4)}
    bits = BITS_PER_ELEMENT
    assert ks["layer_1/experts"].weight_bytes == pytest.approx(E * 3 * H * FE * bits["mxfp4"] / 8)
    assert ks["layer_0/qkv_proj"].weight_bytes == pytest.approx(H * (NH + 2 * KVH) * D * bits["fp8"] / 8)
    assert ks["lm_head"].weight_bytes == H * V * 2 and ks["embed"].weight_bytes == B * H * 2
    assert ks["layer_0/mlp"].flops_by_math_dtype == {"fp4": 6 * B * H * F}
    assert ks["layer_0/attention"].flops_by_math_dtype == {"fp8": 4 * B * NH * S * D}  # attention math
    exp = ks["layer_1/experts"].flops_by_math_dtype
    assert exp["fp4"] == 6 * B * K * H * FE and exp["fp8"] == 2 * B * K * H  # the combine is weightless
    assert ks["lm_head"].flops_by_math_dtype == {"bf16": 2 * B * H * V}
    assert ks["layer_0/attention"].kv_read_bytes == 2 * B * S * KVH * D * 1.0  # re-priced to fp8
    assert toy_kernels["layer_0/attention"].kv_read_bytes == 2 * B * S * KVH * D * 2.0  # original untouched


def test_fp4_attention_recipe_keeps_the_attention_core_at_fp8(toy_kernels):
    """NVIDIA's NVFP4 Llama checkpoints quantise the q/k/v/o projections to FP4; the attention core (scores and
    values) still runs on the FP8 KV cache at FP8: no serving engine's attention kernel computes in FP4."""
    rec = dataclasses.replace(precision("fp4"), attention=TensorPrecision(weights="nvfp4", math="fp4"))
    ks = {k.name: k for k in price(list(toy_kernels.values()), rec)}
    assert ks["layer_0/attention"].flops_by_math_dtype == {"fp8": 4 * B * NH * S * D}
    assert set(ks["layer_0/qkv_proj"].flops_by_math_dtype) == {"fp4"}  # the projections do run at FP4
    assert precision("bf16").attention_core_math == "bf16" and precision("fp8").attention_core_math == "fp8"


@pytest.mark.parametrize("core", ["fp8", "int8", "fp4"])
def test_attention_core_what_if_reprices_only_the_activation_matmuls(toy_kernels, core):
    """``attention_core`` (a model's per_model refinement, as a user sets it from the command line) moves the
    attention core's FLOPs to its dtype and leaves the projections, the KV bytes and the weights where they were."""
    raw = load_yaml("precision/fp4.yaml")
    raw["per_model"]["gpt_oss_120b"] = raw["per_model"]["gpt_oss_120b"] | {"attention_core": core}
    rec = Precision.from_dict(raw).for_workload("gpt_oss_120b")
    base = precision("fp4").for_workload("gpt_oss_120b")
    assert base.attention_core_math == "bf16" and rec.attention_core_math == core  # gpt-oss: BF16 attention
    ks = {k.name: k for k in price(list(toy_kernels.values()), rec)}
    ref = {k.name: k for k in price(list(toy_kernels.values()), base)}
    assert ks["layer_0/attention"].flops_by_math_dtype == {core: 4 * B * NH * S * D}
    assert ref["layer_0/attention"].flops_by_math_dtype == {"bf16": 4 * B * NH * S * D}
    assert ks["layer_0/qkv_proj"].flops_by_math_dtype == ref["layer_0/qkv_proj"].flops_by_math_dtype == {
        "bf16": 2 * B * H * (NH + 2 * KVH) * D}
    for name in ks:
        assert ks[name].weight_bytes == ref[name].weight_bytes and ks[name].kv_read_bytes == ref[name].kv_read_bytes
    assert Precision.from_dict(load_yaml("precision/fp4.yaml")).attention_core is None  # null: engines' practice


def test_an_unknown_attention_core_dtype_names_the_field():
    raw = load_yaml("precision/fp4.yaml")
    raw["per_model"]["gpt_oss_120b"] = raw["per_model"]["gpt_oss_120b"] | {"attention_core": "fp6"}
    with pytest.raises(ConfigError, match=r"precision\.per_model\.gpt_oss_120b\.attention_core.*fp6"):
        Precision.from_dict(raw, "precision")


def test_loops_conditionals_and_nested_jit():
    """scan bodies count length times (weights read once), cond takes the costlier branch, a while body counts
    once, nested jit scopes compose; vector FLOPs are 1 per output element."""
    n, m, steps = 8, 16, 5

    def body_matmul(w, x):
        with jax.named_scope("mlp"):
            return jnp.tanh(x @ w)

    def fn(params, x):
        w = params["layers"][0]["mlp"]["w"]
        with jax.named_scope("layer_0"):
            y = jax.jit(body_matmul)(w, x)  # -> layer_0/mlp
        with jax.named_scope("layer_1/mlp"):
            y = jax.lax.scan(lambda c, _: (c @ w, None), y, None, length=steps)[0]
        with jax.named_scope("layer_2/mlp"):
            y = jax.lax.cond(y.sum() > 0, lambda v: v @ w @ w, lambda v: v @ w, y)
        with jax.named_scope("layer_3/mlp"):
            y = jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] @ w, c[1] + 1), (y, 0))[0]
        with jax.named_scope("final_norm"):
            return jnp.exp(y) + params["final_norm"]

    params = {"layers": [{"mlp": {"w": S_((m, m), jnp.float32)}}], "final_norm": S_((m,), jnp.float32)}
    ks = {k.name: k for k in trace_kernels(fn, params, S_((n, m), jnp.float32))}
    one = 2 * n * m * m
    assert ks["layer_0/mlp"].matmul_flops == one and ks["layer_0/mlp"].vector_flops == n * m  # tanh
    assert ks["layer_1/mlp"].matmul_flops == steps * one
    assert ks["layer_1/mlp"].weight_elements_by_class == {"dense_ffn": m * m}  # read once, not 5 times
    assert ks["layer_2/mlp"].matmul_flops == 2 * one
    assert ks["layer_3/mlp"].matmul_flops == one and ks["layer_3/mlp"].notes == ["while loop body counted once"]
    assert ks["final_norm"].vector_flops == 2 * n * m  # exp and add
    assert ks["final_norm"].weight_elements_by_class == {"norms": m}
    assert ks["final_norm"].activation_out_bytes == n * m * 4


def test_default_param_class():
    path = lambda *keys: tuple(jax.tree_util.DictKey(k) if isinstance(k, str) else jax.tree_util.SequenceKey(k)
                               for k in keys)
    cases = {("embed",): "embedding", ("lm_head",): "lm_head", ("final_norm",): "norms",
             ("layers", 3, "attn", "wq"): "attention", ("layers", 0, "mlp", "w_up"): "dense_ffn",
             ("layers", 1, "experts", "w_down"): "routed_experts", ("layers", 1, "shared", "w"): "shared_experts",
             ("layers", 1, "router", "w"): "router", ("layers", 1, "attn_norm"): "norms",
             ("layers", 1, "ffn_norm", "weight"): "norms", ("mtp", "eh_proj"): "mtp", ("vision", "x"): "vision",
             ("mystery",): "other"}
    for keys, cls in cases.items():
        assert default_param_class(path(*keys)) == cls, keys


# ---------------------------------------------------------------------- MoE statistics
def test_expected_distinct_experts_closed_form_and_limits():
    for e, k, b in [(128, 4, 1), (128, 4, 7), (256, 8, 64), (8, 2, 3)]:
        assert expected_distinct_experts(e, k, b) == pytest.approx(e * (1 - (1 - k / e) ** b))
    assert expected_distinct_experts(128, 4, 1) == pytest.approx(4)
    assert expected_distinct_experts(128, 4, 1, skew=1.0) == pytest.approx(4)  # sum of min(1, k p_i) = k
    assert expected_distinct_experts(128, 4, 100_000) == pytest.approx(128)
    for b in (2, 16, 256):
        uni = expected_distinct_experts(128, 4, b)
        assert expected_distinct_experts(128, 4, b, skew=0.5) < uni
        assert expected_distinct_experts(128, 4, b, skew=1.2) < expected_distinct_experts(128, 4, b, skew=0.5)
    # skewed closed form
    p = 1 / np.arange(1, 9) ** 0.8
    p /= p.sum()
    assert expected_distinct_experts(8, 2, 5, 0.8) == pytest.approx(np.sum(1 - (1 - np.minimum(1, 2 * p)) ** 5))


def test_load_imbalance():
    assert load_imbalance(128, 4, 64, 0.0, 1) == 1.0
    small, large = load_imbalance(128, 4, 8, 0.0, 8), load_imbalance(128, 4, 100_000, 0.0, 8)
    assert small > large >= 1.0 and large < 1.02
    assert load_imbalance(128, 4, 64, 1.0, 8) > load_imbalance(128, 4, 64, 0.0, 8)
    # uniform: n = B k assignments, q = 1/ep each: 1 + sqrt(2 ln ep) sqrt(n q (1-q)) / (n q)
    n, ep = 256 * 4, 8
    closed = 1 + np.sqrt(2 * np.log(ep)) * np.sqrt(n / ep * (1 - 1 / ep)) / (n / ep)
    assert load_imbalance(128, 4, 256, 0.0, ep) == pytest.approx(closed)


# ---------------------------------------------------------------------- collectives
TOY_ARCH = dict(name="toy", family="gqa", num_layers=2, hidden_size=H, vocab_size=V, norm_eps=1e-5,
                max_position_embeddings=4096, rope_theta=1e4, num_attention_heads=NH, num_kv_heads=KVH, head_dim=D,
                intermediate_size=F, num_experts=E, experts_per_token=K, expert_intermediate_size=FE,
                router="topk_softmax", moe_layer_step=2)


def test_comm_tp2_ep4(toy_kernels):
    arch = ModelArchitecture.from_dict(TOY_ARCH)
    assert arch.moe_layer_indices == (1,)
    act = 2.0
    # tp2 x 2 attention replicas, ep4: each replica's B / 2 tokens all-reduce over its tp and all-to-all to the experts
    ks = {k.name: k for k in annotate_comm(list(toy_kernels.values()), ParallelMapping(tp=2, ep=4, dp_attention=2),
                                           arch, B, act)}
    o = ks["layer_0/o_proj"].comm
    assert [(c.op, c.bytes, c.group, c.algorithm) for c in o] == [("all_reduce", B / 2 * H * act, 2, "ring")]
    assert [(c.op, c.bytes) for c in ks["layer_0/mlp"].comm] == [("all_reduce", B / 2 * H * act)]
    a2a = B / 2 * K * H * act * 3 / 4
    assert [(c.op, c.bytes, c.group, c.algorithm, c.where) for c in ks["layer_1/experts"].comm] == [
        ("all_to_all", a2a, 4, "all_to_all", "before"), ("all_to_all", a2a, 4, "all_to_all", "after")]
    # tp2ep2 without attention-DP (vLLM's --enable-expert-parallel at TP 2): every rank holds all B tokens after the
    # attention all-reduce, its experts compute on them and their partial outputs are all-reduced, no all-to-all
    ks = {k.name: k for k in annotate_comm(list(toy_kernels.values()), ParallelMapping(tp=2, ep=2), arch, B, act)}
    assert [(c.op, c.bytes, c.group) for c in ks["layer_1/experts"].comm] == [("all_reduce", B * H * act, 2)]
    assert ks["layer_1/attention"].comm == [] and ks["lm_head"].comm == []
    assert toy_kernels["layer_0/o_proj"].comm == []  # the input list is not modified
    # a quantised dispatch (1.03 bytes per element) shrinks the dispatch only, never the combine or the all-reduces
    ks = {k.name: k for k in annotate_comm(list(toy_kernels.values()), ParallelMapping(tp=2, ep=4, dp_attention=2),
                                           arch, B, act, 1.03)}
    assert [(c.purpose, c.bytes) for c in ks["layer_1/experts"].comm] == [
        ("EP dispatch", B / 2 * K * H * 1.03 * 3 / 4), ("EP combine", a2a)]
    assert [c.bytes for c in ks["layer_0/o_proj"].comm] == [B / 2 * H * act]
    # tp=2 without EP: one all-reduce after the experts; dp_attention with EP: the dense FFN runs data-parallel
    # (a copy per replica), so no collective around it at tp=1 and the replica's all-reduce at tp=2
    ks = {k.name: k for k in annotate_comm(list(toy_kernels.values()), ParallelMapping(tp=2), arch, B, act)}
    assert [(c.op, c.bytes) for c in ks["layer_1/experts"].comm] == [("all_reduce", B * H * act)]
    ks = {k.name: k for k in annotate_comm(list(toy_kernels.values()), ParallelMapping(ep=4, dp_attention=4),
                                           arch, 8, act)}
    assert ks["layer_0/mlp"].comm == []
    assert ks["layer_1/experts"].comm[0].bytes == 8 / 4 * K * H * act * 3 / 4  # local tokens
    ks = {k.name: k for k in annotate_comm(list(toy_kernels.values()), ParallelMapping(tp=2, ep=8, dp_attention=4),
                                           arch, 8, act)}
    assert [(c.op, c.bytes, c.group) for c in ks["layer_0/mlp"].comm] == [("all_reduce", 8 / 4 * H * act, 2)]
    # pp=2: one send/recv after layer 0's last kernel
    ks = annotate_comm(list(toy_kernels.values()), ParallelMapping(pp=2), arch, B, act)
    pp = [(k.name, c.op, c.bytes) for k in ks for c in k.comm]
    assert pp == [("layer_0/mlp", "send_recv", B * H * act)]
    with pytest.raises(ConfigError, match="^tp: must be a whole number >= 1, got 0$"):
        ParallelMapping(tp=0)
    with pytest.raises(ConfigError, match=r"^ep: must be at most tp x dp_attention = 2 .*got 4$"):
        ParallelMapping(tp=2, ep=4)


# ---------------------------------------------------------------------- trace_step on a toy model object
class ToyModel:
    def __init__(self):
        self.traces = 0

    def init(self, key, dtype):
        return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, dtype), toy_params())

    def init_cache(self, batch, max_len, dtype):
        assert (batch, max_len) == (B, S)
        return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype if s.dtype == jnp.int32 else dtype),
                                      toy_cache())

    def decode(self, params, tokens, cache):
        self.traces += 1
        return toy_decode(params, tokens, cache)


def test_trace_step_caches_trace_and_reprices():
    arch = ModelArchitecture.from_dict(TOY_ARCH)
    model = ToyModel()
    g16 = trace_step(model, arch, "decode", B, 1, S, precision("bf16"), mapping=ParallelMapping(ep=4, dp_attention=4),
                     skew=0.0)
    g4 = trace_step(model, arch, "decode", B, 1, S, precision("fp4"), mapping=ParallelMapping(ep=4, dp_attention=4),
                    skew=1.0)
    assert model.traces == 1  # re-pricing does not re-trace
    ex16, ex4 = g16.kernel("layer_1/experts"), g4.kernel("layer_1/experts")
    assert (ex16.num_experts, ex16.experts_per_token) == (E, K)
    assert ex16.expected_experts_touched == pytest.approx(expected_distinct_experts(E, K, B))
    assert ex4.expected_experts_touched < ex16.expected_experts_touched
    assert ex16.load_imbalance == pytest.approx(load_imbalance(E, K, B, 0.0, 4))
    routed = E * 3 * H * FE * 2
    assert ex16.touched_weight_bytes == pytest.approx(routed * ex16.expected_experts_touched / E)
    t16, t4 = g16.totals(), g4.totals()
    assert t16["matmul_flops"] == t4["matmul_flops"] and t4["weight_bytes"] < t16["weight_bytes"]
    assert set(t16["matmul_flops_by_dtype"]) == {"bf16"}
    assert t16["kv_read_bytes"] == 2 * t4["kv_read_bytes"]
    assert t16["comm_bytes"] == 2 * B / 4 * K * H * 2 * 3 / 4  # dispatch + combine of each replica's B / 4 tokens
    # FP4 experts take FP8-quantised activations: the dispatch moves 1 byte + an FP32 scale per 128 channels per
    # element (DeepSeek-V3 report sec. 3.3.2; DeepEP), the combine still the BF16 outputs
    assert [c.bytes for c in ex4.comm] == pytest.approx([B / 4 * K * H * (1 + 4 / 128) * 3 / 4, B / 4 * K * H * 2 * 3 / 4])
    assert t4["comm_bytes"] == pytest.approx(B / 4 * K * H * (1 + 4 / 128 + 2) * 3 / 4)
    doc = json.loads(g4.to_json())
    assert doc["meta"]["precision"] == "fp4" and len(doc["kernels"]) == len(g4.kernels)


# ---------------------------------------------------------------------- the real models at full size
def _model_or_skip(module: str, workload: str):
    if importlib.util.find_spec(f"serving.models.{module}") is None:
        pytest.skip(f"serving/models/{module}.py does not exist yet")
    from serving.models import build_model
    arch = ModelArchitecture.from_dict(load_yaml(f"workload/{workload}.yaml"))
    return build_model(arch), arch


FULL_SIZE = [("gqa", "llama3_8b"), pytest.param("gqa", "gpt_oss_120b", marks=pytest.mark.slow),
             pytest.param("mla", "deepseek_r1", marks=pytest.mark.slow)]


@pytest.mark.parametrize("module,workload", FULL_SIZE)
def test_full_size_decode_graph(module, workload):
    model, arch = _model_or_skip(module, workload)
    context = 64  # within gpt-oss's 128-token window (its model attends over the whole cache, masked)
    t0 = time.perf_counter()
    g = trace_step(model, arch, "decode", 1, 1, context, precision("bf16"))
    print(f"{workload}: traced full-size decode in {time.perf_counter() - t0:.2f} s, {len(g.kernels)} kernels")
    counts = arch.param_counts()
    by_class = {}
    for k in g.kernels:
        for c, n in k.weight_elements_by_class.items():
            by_class[c] = by_class.get(c, 0) + n
    # every weight but the input embedding (B = 1 gathered row) and the MTP head (not run by decode)
    assert by_class.pop("embedding") == arch.hidden_size
    assert by_class == {c: n for c, n in counts.items() if n and c not in ("embedding", "mtp", "vision")}
    flops = g.totals()["matmul_flops"]
    target = 2 * arch.active_params_per_token + arch.decode_attention_flops_per_token(context)
    assert flops == pytest.approx(target, rel=0.05)  # MoE: only the k routed experts each token uses
    if arch.num_experts:
        experts = [k for k in g.kernels if k.kind == "moe_experts"]
        assert len(experts) == arch.num_moe_layers
        for k in experts:
            assert k.weight_elements_by_class["routed_experts"] == arch.num_experts * arch.expert_params
            assert k.expected_experts_touched == pytest.approx(arch.experts_per_token)
            assert k.ragged_rows == arch.experts_per_token and k.ragged_groups == arch.num_experts
    assert sum(k.kv_read_elements for k in g.kernels) == arch.kv_cache_elements(context)
    assert sum(k.kv_write_elements for k in g.kernels) == arch.kv_cache_elements_per_token_per_layer * arch.num_layers


def test_full_size_prefill_graph():
    model, arch = _model_or_skip("gqa", "llama3_8b")
    b, t = 2, 256
    g = trace_step(model, arch, "prefill", b, t, 2 * t, precision("fp8"), mapping=ParallelMapping(tp=4))
    tot = g.totals()
    assert tot["kv_write_bytes"] == b * t * arch.kv_cache_elements_per_token_per_layer * arch.num_layers * 1.0
    assert tot["kv_read_bytes"] == 0  # prefill attends over the fresh keys
    # every token through every weight but the lm_head, which runs on each prompt's last position only (what a
    # serving engine samples from), plus causal-free attention over T keys
    per_layer_attn = 2 * 2 * arch.num_attention_heads * arch.head_dim * t * t * b
    head = arch.hidden_size * arch.vocab_size
    assert tot["matmul_flops"] == pytest.approx(2 * (arch.active_params_per_token - head) * b * t + 2 * head * b
                                                + arch.num_layers * per_layer_attn, rel=0.01)
    lm = [k for k in g.kernels if k.name == "lm_head"]
    assert len(lm) == 1 and lm[0].matmul_flops == 2 * head * b
    assert set(tot["matmul_flops_by_dtype"]) == {"fp8", "bf16"}  # lm_head in the embeddings recipe
    assert tot["comm_bytes"] == 2 * arch.num_layers * b * t * arch.hidden_size * 2.0
