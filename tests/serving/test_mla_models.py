"""MLA models (DeepSeek-V3/R1, Kimi K2.5): serving/models/mla.py and serving/models/vision.py.

Tiny float32 models are checked against an independent NumPy float64 reference written here from the DeepSeek-V3
``inference/model.py`` formulas (explicit per-head MLA without absorption, explicit interleaved RoPE with YaRN
frequencies, a per-token loop over the grouped sigmoid router and the experts); the full-size configs are traced
abstractly (``jax.eval_shape`` / ``jax.make_jaxpr`` over ``ShapeDtypeStruct`` parameters, nothing allocated).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from serving.architecture import ModelArchitecture
from serving.architecture_parts import VisionTower
from serving.models import build_model
from serving.models.moe import route
from serving.models.vision import VisionEncoder

WORKLOADS = Path(__file__).resolve().parents[2] / "conf" / "workload"

TINY_VISION = dict(num_layers=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, merge_size=2,
                   projector_hidden_size=128, projector_output_size=64, pos_emb_grid=[4, 4])

# DeepSeek-like: 1 dense + 2 MoE layers, 8 experts in 4 groups (2 kept), top-2, YaRN, 1 MTP layer.
TINY_DEEPSEEK = dict(
    name="tiny_deepseek", family="mla", num_layers=3, hidden_size=64, vocab_size=97, norm_eps=1e-6,
    max_position_embeddings=64, rope_theta=10000.0,
    rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                      mscale=1.0, mscale_all_dim=1.0),
    num_attention_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    intermediate_size=96, num_experts=8, experts_per_token=2, expert_intermediate_size=32, num_shared_experts=1,
    shared_expert_intermediate_size=32, first_k_dense_layers=1, router="sigmoid_grouped",
    router_score_correction_bias=True, router_normalize_topk=True, n_group=4, topk_group=2, routed_scaling_factor=2.5,
    num_mtp_layers=1)
# Kimi-like: no group limit (n_group 1), beta_fast == beta_slow (the ramp's min == max guard), a vision tower.
TINY_KIMI = TINY_DEEPSEEK | dict(
    name="tiny_kimi", num_layers=2, rope_theta=50000.0, n_group=1, topk_group=1, routed_scaling_factor=2.827,
    rope_scaling=dict(type="yarn", factor=8.0, original_max_position_embeddings=8, beta_fast=1.0, beta_slow=1.0,
                      mscale=1.0, mscale_all_dim=1.0),
    num_mtp_layers=0, vision=TINY_VISION)
# DeepSeek-V2-Lite-like: no q LoRA (a plain q projection), no RoPE scaling, no shared expert, no correction bias.
TINY_PLAIN_Q = TINY_DEEPSEEK | dict(
    name="tiny_plain_q", q_lora_rank=None, rope_scaling=None, num_shared_experts=0,
    shared_expert_intermediate_size=None, router_score_correction_bias=False, router_normalize_topk=False,
    routed_scaling_factor=1.0, num_mtp_layers=0)
TINY = {"deepseek": TINY_DEEPSEEK, "kimi": TINY_KIMI, "plain_q": TINY_PLAIN_Q}


def tiny(name):
    return ModelArchitecture.from_dict(TINY[name])


def perturbed_params(model, seed=0):
    """Random float32 parameters drawn in NumPy over ``jax.eval_shape(model.init)`` (no XLA compilation per
    shape, which dominates the run time of eager tiny models): weights ``N(0, 1/fan_in)``, embeddings ``N(0, 1)``,
    norm weights ``1 + N(0, 0.2^2)`` and correction / linear biases non-zero, so that every term is exercised."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed + 100)

    def draw(path, s):
        name = path[-1].key
        z = rng.standard_normal(s.shape)
        if name in ("correction_bias", "bias"):
            value = 0.3 * z if name == "correction_bias" else 0.1 * z
        elif len(s.shape) == 1:  # RMSNorm / LayerNorm weights
            value = 1 + 0.2 * z
        elif name == "embed":
            value = z
        elif name == "pos_emb":
            value = 0.1 * z
        else:
            value = z / math.sqrt(s.shape[-2])  # [in, out] and [E, in, out]
        return jnp.asarray(value, s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def to_np(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


# ====================================================================== the independent NumPy reference
def ref_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def ref_silu(x):
    return x / (1 + np.exp(-x))


def ref_rope_freqs(arch):
    """DeepSeek-V3 inference/model.py precompute_freqs_cis (YaRN with find_correction_range, linear ramp)."""
    dim, base = arch.qk_rope_head_dim, arch.rope_theta
    freqs = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    sc = arch.rope_scaling
    if sc is None:
        return freqs

    def correction_dim(rotations):
        return dim * math.log(sc.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(sc.beta_fast)), 0)
    high = min(math.ceil(correction_dim(sc.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    smooth = 1 - np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    return freqs / sc.factor * (1 - smooth) + freqs * smooth


def ref_rope(x, positions, freqs):
    """apply_rotary_emb: adjacent pairs as complex numbers times exp(i pos freq); ``x [T, d]``, ``freqs [d/2]``
    (or ``[T, d/2]`` angles with ``positions`` 1)."""
    angles = np.outer(positions, freqs) if np.ndim(freqs) == 1 else positions * freqs
    z = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * angles)
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = z.real, z.imag
    return out


def ref_softmax_scale(arch):
    scale = (arch.qk_nope_head_dim + arch.qk_rope_head_dim) ** -0.5
    sc = arch.rope_scaling
    if sc is not None and sc.mscale_all_dim:
        mscale = 0.1 * sc.mscale_all_dim * math.log(sc.factor) + 1.0  # MLA.__init__
        scale *= mscale * mscale
    return scale


def ref_mla(arch, p, x, positions):
    """Un-absorbed MLA of one sequence ``x [T, h]``, one head at a time, causal."""
    H, dn, dr, dv, r = (arch.num_attention_heads, arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim,
                        arch.kv_lora_rank)
    T = len(x)
    freqs = ref_rope_freqs(arch)
    if arch.q_lora_rank:
        q = ref_rms(x @ p["q_a_proj"], p["q_a_layernorm"], arch.norm_eps) @ p["q_b_proj"]
    else:
        q = x @ p["q_b_proj"]
    q = q.reshape(T, H, dn + dr)
    kv = x @ p["kv_a_proj"]
    latent = ref_rms(kv[:, :r], p["kv_a_layernorm"], arch.norm_eps)
    k_pe = ref_rope(kv[:, r:], positions, freqs)
    kv_b = p["kv_b_proj"].reshape(r, H, dn + dv)
    out = np.zeros((T, H, dv))
    for head in range(H):
        q_h = np.concatenate([q[:, head, :dn], ref_rope(q[:, head, dn:], positions, freqs)], axis=1)
        k_h = np.concatenate([latent @ kv_b[:, head, :dn], k_pe], axis=1)
        v_h = latent @ kv_b[:, head, dn:]
        scores = q_h @ k_h.T * ref_softmax_scale(arch)
        scores[positions[:, None] < positions[None, :]] = -np.inf
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        out[:, head] = probs @ v_h
    return out.reshape(T, H * dv) @ p["o_proj"]


def ref_route(logits, bias, arch):
    """model.py Gate for one token: sigmoid scores, biased selection within the topk_group best groups (group
    score: the sum of its two best biased scores), unbiased weights, normalised, scaled."""
    scores = 1 / (1 + np.exp(-logits))
    biased = scores + (0 if bias is None else bias)
    choice = biased.copy()
    if arch.n_group and arch.n_group > 1:
        size = arch.num_experts // arch.n_group
        group_scores = [np.sort(biased[g * size:(g + 1) * size])[-2:].sum() for g in range(arch.n_group)]
        kept = np.argsort(group_scores)[::-1][:arch.topk_group]
        choice = np.full_like(biased, -np.inf)
        for g in kept:
            choice[g * size:(g + 1) * size] = biased[g * size:(g + 1) * size]
    idx = np.argsort(choice)[::-1][:arch.experts_per_token]
    w = scores[idx]
    if arch.router_normalize_topk:
        w = w / w.sum()
    return w * arch.routed_scaling_factor, idx


def ref_swiglu(x, p):
    return (ref_silu(x @ p["gate"]) * (x @ p["up"])) @ p["down"]


def ref_ffn(arch, p, x):
    if "mlp" in p:
        return ref_swiglu(x, p["mlp"])
    out = np.zeros_like(x)
    for t in range(len(x)):
        w, idx = ref_route(x[t] @ p["router"]["weight"], p["router"].get("correction_bias"), arch)
        for weight, e in zip(w, idx):
            expert = {k: v[e] for k, v in p["experts"].items()}
            out[t] += weight * ref_swiglu(x[t], expert)
        if "shared" in p:
            out[t] += ref_swiglu(x[t], p["shared"])
    return out


def ref_layer(arch, p, x, positions):
    x = x + ref_mla(arch, p["attn"], ref_rms(x, p["attn_norm"], arch.norm_eps), positions)
    return x + ref_ffn(arch, p, ref_rms(x, p["ffn_norm"], arch.norm_eps))


def ref_forward(arch, params, tokens, input_embeds=None):
    """``(logits [B, T, V], final-normed hidden [B, T, h])``."""
    logits, hidden = [], []
    for b in range(tokens.shape[0]):
        x = params["embed"][tokens[b]] if input_embeds is None else input_embeds[b]
        positions = np.arange(len(x))
        for p in params["layers"]:
            x = ref_layer(arch, p, x, positions)
        h = ref_rms(x, params["final_norm"], arch.norm_eps)
        hidden.append(h)
        logits.append(h @ params["lm_head"])
    return np.stack(logits), np.stack(hidden)


def ref_mtp(arch, params, hidden, next_tokens):
    p = params["mtp"]
    out = []
    for b in range(hidden.shape[0]):
        e = ref_rms(params["embed"][next_tokens[b]], p["enorm"], arch.norm_eps)
        x = np.concatenate([e, ref_rms(hidden[b], p["hnorm"], arch.norm_eps)], axis=1) @ p["eh_proj"]
        x = ref_layer(arch, p["layer"], x, np.arange(len(x)))
        out.append(ref_rms(x, p["final_norm"], arch.norm_eps) @ params["lm_head"])
    return np.stack(out)


def ref_layer_norm(x, p, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * p["scale"] + p["bias"]


def ref_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_vision(vt, p, image):
    """MoonViT on one image ``[H, W, C]`` whose patch grid is the learned position grid."""
    P, k, d, heads = vt.patch_size, vt.merge_size, vt.hidden_size, vt.num_heads
    hd = d // heads
    gh, gw = image.shape[0] // P, image.shape[1] // P
    rows = []
    for i in range(gh):
        for j in range(gw):
            rows.append(image[i * P:(i + 1) * P, j * P:(j + 1) * P, :].reshape(-1))  # (row, col, channel)
    x = np.stack(rows) @ p["patch_embed"]["kernel"] + p["patch_embed"]["bias"] + p["pos_emb"].reshape(gh * gw, d)
    # Rope2DPosEmb: pair 2m rotates by col * f_m, pair 2m+1 by row * f_m, f_m = 10000^(-4m / head_dim)
    f = 10000.0 ** (-np.arange(0, hd, 4) / hd)
    col, row = np.arange(gh * gw) % gw, np.arange(gh * gw) // gw
    angles = np.zeros((gh * gw, hd // 2))
    angles[:, 0::2], angles[:, 1::2] = np.outer(col, f), np.outer(row, f)
    for blk in p["blocks"]:
        qkv = (ref_layer_norm(x, blk["norm0"]) @ blk["qkv"]["kernel"] + blk["qkv"]["bias"]).reshape(-1, 3, heads, hd)
        o = np.zeros((len(x), heads, hd))
        for head in range(heads):
            q, kk, v = (qkv[:, n, head] for n in range(3))
            q, kk = ref_rope(q, 1, angles), ref_rope(kk, 1, angles)  # angles per patch, not pos * freq
            scores = q @ kk.T / math.sqrt(hd)
            probs = np.exp(scores - scores.max(1, keepdims=True))
            o[:, head] = (probs / probs.sum(1, keepdims=True)) @ v
        x = x + o.reshape(len(x), d) @ blk["o_proj"]["kernel"] + blk["o_proj"]["bias"]
        hmid = ref_gelu_tanh(ref_layer_norm(x, blk["norm1"]) @ blk["fc0"]["kernel"] + blk["fc0"]["bias"])
        x = x + hmid @ blk["fc1"]["kernel"] + blk["fc1"]["bias"]
    x = ref_layer_norm(x, p["final_norm"]).reshape(gh, gw, d)
    pp = p["projector"]
    merged = []
    for i in range(0, gh, k):
        for j in range(0, gw, k):
            window = [ref_layer_norm(x[i + a, j + b], pp["pre_norm"]) for a in range(k) for b in range(k)]
            merged.append(np.concatenate(window))
    y = np.stack(merged) @ pp["linear_1"]["kernel"] + pp["linear_1"]["bias"]
    y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))  # exact GELU
    return y @ pp["linear_2"]["kernel"] + pp["linear_2"]["bias"]


# ====================================================================== fixtures
# XLA compilation dominates the run time of these tiny models, so each model's entry points are jitted once (always
# returning the hidden states, one static ``absorbed`` flag) and every test reuses them with the same shapes:
# sequences of T = 8 tokens, prefill of P = 5, cache of L = 16 slots.
T, P, L = 8, 5, 16


class Tiny:
    def __init__(self, name):
        self.arch = tiny(name)
        self.model = build_model(self.arch)
        self.params = perturbed_params(self.model)
        self.np_params = to_np(self.params)
        self.tokens = jnp.asarray(np.random.default_rng(1).integers(0, self.arch.vocab_size, (2, T)), jnp.int32)
        m = self.model
        self.forward = jax.jit(lambda p, x, absorbed: m.forward(p, None, input_embeds=x, absorbed=absorbed,
                                                                return_hidden=True), static_argnums=2)
        self.prefill = jax.jit(lambda p, t, c, absorbed: m.prefill(p, t, c, absorbed=absorbed, return_hidden=True),
                               static_argnums=3)
        self.decode = jax.jit(lambda p, t, c, absorbed: m.decode(p, t, c, absorbed=absorbed), static_argnums=3)

    def run(self, tokens=None, embeds=None, absorbed=False):
        """``(logits, hidden)`` of the full forward pass (token embeddings unless ``embeds`` are given)."""
        if embeds is None:
            embeds = self.model.embed(self.params, self.tokens if tokens is None else tokens)
        return self.forward(self.params, embeds, absorbed)


_TINY = {}


def get(name) -> Tiny:
    if name not in _TINY:
        _TINY[name] = Tiny(name)
    return _TINY[name]


def close(a, b, rtol=1e-5, atol=2e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)


def test_init_draws_the_declared_tree():
    t = get("kimi")
    params = t.model.init(jax.random.PRNGKey(0))
    shapes = jax.eval_shape(t.model.init, jax.random.PRNGKey(0))
    assert jax.tree.structure(params) == jax.tree.structure(shapes) == jax.tree.structure(t.params)
    assert all(x.shape == y.shape for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(shapes)))
    assert sum(x.size for x in jax.tree.leaves(params)) == t.arch.total_params + t.arch.param_counts()["mtp"]
    layer = params["layers"][1]
    assert np.all(np.asarray(layer["attn_norm"]) == 1) and np.all(np.asarray(layer["attn"]["kv_a_layernorm"]) == 1)
    assert np.all(np.asarray(layer["router"]["correction_bias"]) == 0)
    experts = np.asarray(layer["experts"]["gate"])
    assert abs(experts.std() * math.sqrt(t.arch.hidden_size) - 1) < 0.05  # N(0, 1/fan_in)
    assert not np.allclose(experts[0], experts[1])  # distinct slices of the one draw
    assert jax.eval_shape(lambda k: t.model.init(k, jnp.bfloat16), jax.random.PRNGKey(0))["embed"].dtype == jnp.bfloat16


# ====================================================================== numerics against the reference
@pytest.mark.parametrize("name, absorbed", [("deepseek", False), ("kimi", False), ("plain_q", True)])
def test_forward_matches_reference(name, absorbed):
    t = get(name)
    logits, hidden = t.run(absorbed=absorbed)
    ref_logits, ref_hidden = ref_forward(t.arch, t.np_params, np.asarray(t.tokens))
    assert logits.shape == (2, T, t.arch.vocab_size) and logits.dtype == jnp.float32
    close(hidden, ref_hidden)
    close(logits, ref_logits)


def test_absorbed_matches_unabsorbed():
    t = get("deepseek")
    close(t.run(absorbed=True)[0], t.run(absorbed=False)[0])
    cache = t.model.init_cache(2, L)
    (la, ca, _), (ln, cn, _) = (t.prefill(t.params, t.tokens[:, :P], cache, a) for a in (True, False))
    close(la, ln)
    for x, y in zip(jax.tree.leaves(ca), jax.tree.leaves(cn)):
        close(x, y)
    (da, _), (dn, _) = (t.decode(t.params, t.tokens[:, P:P + 1], ca, a) for a in (True, False))
    close(da, dn)


@pytest.mark.parametrize("name", ["deepseek", "kimi"])
def test_decode_after_prefill_matches_forward(name):
    t = get(name)
    full_logits = t.run()[0]
    logits, cache, _ = t.prefill(t.params, t.tokens[:, :P], t.model.init_cache(2, L), False)
    close(logits, full_logits[:, P - 1:P])  # serving prefill: the last position's logits only
    every, _ = jax.jit(lambda p, x, c: t.model.prefill(p, x, c, all_logits=True))(
        t.params, t.tokens[:, :P], t.model.init_cache(2, L))
    close(every, full_logits[:, :P])
    assert int(cache["length"]) == P
    assert cache["layers"][0]["latent"].shape == (2, L, t.arch.kv_lora_rank)
    assert cache["layers"][0]["k_rope"].shape == (2, L, t.arch.qk_rope_head_dim)
    assert len(cache["layers"]) == t.arch.num_layers
    prefilled = cache
    for i in range(P, T):  # absorbed decode, one token at a time
        logits, cache = t.decode(t.params, t.tokens[:, i:i + 1], cache, True)
        assert logits.shape == (2, 1, t.arch.vocab_size)
        close(logits[:, 0], full_logits[:, i])
    assert int(cache["length"]) == T
    # the three tokens in one decode call (speculative verification) from the same prefilled cache
    logits, cache = jax.jit(lambda p, x, c: t.model.decode(p, x, c))(t.params, t.tokens[:, P:], prefilled)
    close(logits, full_logits[:, P:])
    assert int(cache["length"]) == T


# ====================================================================== routing
def test_group_limited_routing_drops_groups():
    """The two best experts (0 and 2) sit in groups whose second expert is hopeless; with 2 of 4 groups kept
    (group score: the sum of the two best), groups 2 and 3 win and the top-2 comes from them."""
    arch = tiny("deepseek")
    logits = np.array([[5.0, -5.0, 4.0, -5.0, 3.0, 3.0, 2.9, 2.9]])
    kw = dict(router="sigmoid_grouped", top_k=2, routed_scaling_factor=2.5, normalize_topk=True)
    grouped_w, grouped_i = route(jnp.asarray(logits), n_group=4, topk_group=2, **kw)
    flat_w, flat_i = route(jnp.asarray(logits), n_group=1, topk_group=1, **kw)
    assert sorted(np.asarray(grouped_i[0]).tolist()) == [4, 5]
    assert sorted(np.asarray(flat_i[0]).tolist()) == [0, 2]
    ref_w, ref_i = ref_route(logits[0], None, arch)
    assert sorted(ref_i.tolist()) == [4, 5]
    close(np.sort(np.asarray(grouped_w[0])), np.sort(ref_w))
    close(np.sum(np.asarray(grouped_w[0])), 2.5)  # normalised, then scaled
    # the correction bias moves the selection back to groups 0 and 1; the weights stay the unbiased scores
    bias = np.array([0.0, 0.0, 0.0, 0.0, -2.0, -2.0, -2.0, -2.0])
    bw, bi = route(jnp.asarray(logits), n_group=4, topk_group=2, correction_bias=jnp.asarray(bias), **kw)
    rw, ri = ref_route(logits[0], bias, arch)
    assert sorted(np.asarray(bi[0]).tolist()) == sorted(ri.tolist()) == [0, 2]
    close(np.sort(np.asarray(bw[0])), np.sort(rw))
    close(np.sort(np.asarray(bw[0])), np.sort(np.asarray(flat_w[0])))


def test_group_limit_changes_the_moe_layer():
    t = get("deepseek")
    ungrouped = build_model(dataclasses.replace(t.arch, n_group=1, topk_group=1))
    x = jnp.asarray(np.random.default_rng(4).standard_normal((1, 16, t.arch.hidden_size)), jnp.float32)
    layer = t.params["layers"][1]
    a = jax.jit(lambda p, x: t.model._ffn("layer_1", p, x))(layer, x)
    b = jax.jit(lambda p, x: ungrouped._ffn("layer_1", p, x))(layer, x)
    rows = np.max(np.abs(np.asarray(a - b)), axis=-1)[0]
    assert np.sum(rows > 1e-3) >= 2  # some tokens' top-2 spanned a dropped group
    assert np.sum(rows < 1e-6) >= 1  # others' did not
    close(a[0], ref_ffn(t.arch, t.np_params["layers"][1], np.asarray(x[0], np.float64)))


# ====================================================================== MTP, vision, structure
def test_mtp_draft_head():
    t = get("deepseek")
    logits, hidden = t.run()
    assert hidden.shape == (2, T, t.arch.hidden_size)
    mtp = jax.jit(lambda p, h, x: t.model.mtp_draft(p, h, x))
    draft = mtp(t.params, hidden[:, :-1], t.tokens[:, 1:])  # position i: h_i and t_{i+1} -> t_{i+2}
    assert draft.shape == (2, T - 1, t.arch.vocab_size)
    close(draft, ref_mtp(t.arch, t.np_params, np.asarray(hidden[:, :-1], np.float64), np.asarray(t.tokens[:, 1:])))
    # the prefill returns the same hidden states; incremental drafting with the MTP layer's own latent cache
    # (absorbed) gives the same logits as the cache-free pass
    _, _, hidden_p = t.prefill(t.params, t.tokens[:, :P], t.model.init_cache(2, L), False)
    close(hidden_p, hidden[:, :P])
    step_fn = jax.jit(lambda p, h, x, c: t.model.mtp_draft(p, h, x, cache=c))
    mtp_cache = t.model.init_mtp_cache(2, L)
    for i in range(T - 1):
        step, mtp_cache = step_fn(t.params, hidden[:, i:i + 1], t.tokens[:, i + 1:i + 2], mtp_cache)
        close(step[:, 0], draft[:, i])
    assert int(mtp_cache["length"]) == T - 1
    kimi = get("kimi")
    with pytest.raises(ValueError, match="no MTP"):
        kimi.model.mtp_draft(kimi.params, hidden, t.tokens)


def test_vision_tower_and_splicing():
    t = get("kimi")
    model, params, vt = t.model, t.params, t.arch.vision
    assert sum(x.size for x in jax.tree.leaves(params["vision"])) == vt.param_count()
    rng = np.random.default_rng(3)
    pixels = jnp.asarray(rng.standard_normal((2, 16, 16, 3)), jnp.float32)  # 4x4 patches = the learned grid
    images = jax.jit(model.encode_images)(params, pixels)
    assert images.shape == (2, 4, t.arch.hidden_size)
    for n in range(2):
        close(images[n], ref_vision(vt, t.np_params["vision"], np.asarray(pixels[n], np.float64)), rtol=1e-4)
    # another grid: the position embedding is resized, 6x4 patches -> 3x2 merged tokens
    other = jax.eval_shape(model.encode_images, params, jax.ShapeDtypeStruct((1, 24, 16, 3), jnp.float32))
    assert other.shape == (1, 6, t.arch.hidden_size) == (1, model.vision.num_tokens(24, 16), t.arch.hidden_size)
    with pytest.raises(ValueError, match="merge windows"):
        model.encode_images(params, jnp.ones((1, 20, 16, 3)))
    # splice the 4 image tokens of each image at positions 3..6 of the prompt
    mask = jnp.zeros((2, T), bool).at[:, 3:7].set(True)
    embeds = model.splice_embeds(model.embed(params, t.tokens), images, mask)
    close(embeds[:, 3:7], images)
    close(embeds[:, :3], params["embed"][t.tokens[:, :3]])
    close(embeds[:, 7:], params["embed"][t.tokens[:, 7:]])
    plain = t.run()[0]
    spliced = t.run(embeds=embeds)[0]
    close(spliced[:, :3], plain[:, :3])  # causal: positions before the image are unchanged
    assert np.min(np.max(np.abs(np.asarray(spliced[:, 3:] - plain[:, 3:])), axis=-1)) > 1e-3
    close(spliced, ref_forward(t.arch, t.np_params, np.asarray(t.tokens), np.asarray(embeds, np.float64))[0])
    # prefill accepts the same override (traced abstractly: same code path as forward)
    out = jax.eval_shape(lambda p, x, c: model.prefill(p, None, c, input_embeds=x), params, embeds,
                         model.init_cache(2, L))
    assert out[0].shape == (2, 1, t.arch.vocab_size)  # the last position's logits (serving prefill)


def _primitives(jaxpr, out=None):
    out = set() if out is None else out
    for eqn in jaxpr.eqns:
        out.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _primitives(sub, out)
    return out


def _scopes(jaxpr, prefix=""):
    """Every equation's name stack composed through the jitted blocks it sits in (as the graph walker reads it)."""
    out = set()
    for e in jaxpr.eqns:
        stack = "/".join(s for s in (prefix, str(e.source_info.name_stack)) if s)
        out.add(stack)
        for sub in jax.extend.core.jaxprs_in_params(e.params):
            out |= _scopes(sub, stack)
    return out


def test_moe_layer_uses_ragged_dot_and_named_scopes():
    arch = tiny("deepseek")
    model = build_model(arch)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))  # abstract: make_jaxpr only
    tokens, x = 10, jax.ShapeDtypeStruct((2, 5, arch.hidden_size), jnp.float32)
    moe = jax.make_jaxpr(lambda p, x: model._ffn("layer_1", p, x))(params["layers"][1], x)
    dense = jax.make_jaxpr(lambda p, x: model._ffn("layer_0", p, x))(params["layers"][0], x)
    assert {"ragged_dot", "ragged_dot_general"} & _primitives(moe.jaxpr)
    assert not {"ragged_dot", "ragged_dot_general"} & _primitives(dense.jaxpr)
    # no [T, E, ...] one-hot over all experts: every intermediate is smaller than T * E * h
    assert max(math.prod(v.aval.shape) for e in moe.jaxpr.eqns for v in e.outvars) < (
        tokens * arch.num_experts * arch.hidden_size)
    forward = _scopes(jax.make_jaxpr(model.forward)(params, jax.ShapeDtypeStruct((1, 4), jnp.int32)).jaxpr)
    for kernel in ("attn_norm", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "attention", "o_proj", "ffn_norm"):
        assert f"layer_2/{kernel}" in forward
    assert {"layer_0/mlp", "layer_1/router", "layer_1/experts", "layer_1/shared_expert", "embed", "final_norm",
            "lm_head"} <= forward
    assert "layer_0/experts" not in forward and "layer_1/mlp" not in forward
    cache = jax.eval_shape(lambda: model.init_cache(1, 16))
    decode = _scopes(jax.make_jaxpr(model.decode)(params, jax.ShapeDtypeStruct((1, 1), jnp.int32), cache).jaxpr)
    assert {"layer_2/kv_b_proj", "layer_2/attention", "layer_2/experts"} <= decode
    mtp = _scopes(jax.make_jaxpr(model.mtp_draft)(params, jax.ShapeDtypeStruct((1, 4, arch.hidden_size), jnp.float32),
                                                  jax.ShapeDtypeStruct((1, 4), jnp.int32)).jaxpr)
    assert {"mtp/enorm", "mtp/hnorm", "mtp/eh_proj", "mtp/layer_0/attention", "mtp/layer_0/experts",
            "mtp/final_norm", "mtp/lm_head"} <= mtp
    assert all(s.startswith("mtp/") for s in mtp if s)


# ====================================================================== full size, abstract
def full(name):
    return ModelArchitecture.from_dict(OmegaConf.to_container(OmegaConf.load(WORKLOADS / f"{name}.yaml")))


CLASS_OF = {"embed": "embedding", "lm_head": "lm_head", "final_norm": "norms", "mtp": "mtp", "vision": "vision",
            "attn": "attention", "mlp": "dense_ffn", "experts": "routed_experts", "shared": "shared_experts",
            "router": "router", "attn_norm": "norms", "ffn_norm": "norms"}


@pytest.mark.parametrize("name", ["deepseek_r1", "kimi_k2_5"])
def test_full_size_abstract_trace(name):
    arch = full(name)
    model = build_model(arch)
    shapes = jax.eval_shape(lambda k: model.init(k, jnp.bfloat16), jax.random.PRNGKey(0))
    by_class = dict.fromkeys(arch.param_counts(), 0)
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        keys = [p.key for p in path if hasattr(p, "key")]
        key = keys[1] if keys[0] == "layers" else keys[0]
        by_class[CLASS_OF[key]] += math.prod(leaf.shape)
    assert by_class == arch.param_counts()
    assert sum(by_class.values()) == arch.total_params + arch.param_counts()["mtp"]
    if arch.vision is not None:
        assert by_class["vision"] == arch.vision.param_count()

    cache = jax.eval_shape(lambda: model.init_cache(1, 128, jnp.bfloat16))
    per_token = sum(math.prod(c.shape[2:]) for layer in cache["layers"] for c in layer.values())
    assert per_token == arch.num_layers * arch.kv_cache_elements_per_token_per_layer  # 61 x 576
    start = time.perf_counter()
    jaxpr = jax.make_jaxpr(model.decode)(shapes, jax.ShapeDtypeStruct((1, 1), jnp.int32), cache)
    assert time.perf_counter() - start < 30
    logits, latent = jaxpr.out_avals[0], jaxpr.out_avals[1]  # (logits, cache leaves...)
    assert logits.shape == (1, 1, arch.vocab_size)
    assert latent.shape[:2] == (1, 128)
    assert {"ragged_dot", "ragged_dot_general"} & _primitives(jaxpr.jaxpr)
    if arch.vision is not None:  # one 448x448 image -> 32x32 patches -> 256 tokens of the text width
        out = jax.eval_shape(model.encode_images, shapes, jax.ShapeDtypeStruct((1, 448, 448, 3), jnp.bfloat16))
        assert out.shape == (1, 256, arch.hidden_size)
    if arch.num_mtp_layers:
        out = jax.eval_shape(model.mtp_draft, shapes, jax.ShapeDtypeStruct((1, 4, arch.hidden_size), jnp.bfloat16),
                             jax.ShapeDtypeStruct((1, 4), jnp.int32))
        assert out.shape == (1, 4, arch.vocab_size)


def test_vision_encoder_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="divisible by 4"):
        VisionEncoder(VisionTower(**(TINY_VISION | dict(hidden_size=24, num_heads=4, projector_hidden_size=96,
                                                        pos_emb_grid=(4, 4)))))
