"""GQA model code (serving/models/{common,moe,gqa}.py) against independent NumPy references.

The references below are written from the published formulas with explicit Python loops in float64 (per head,
per query, per token and chosen expert, per rotary pair), sharing no code with the model. Tiny configs of each
gqa kind (Llama 3 dense, gpt-oss, Qwen3 MoE, Llama 4) run in float32 and must match to rtol 1e-5; decode after
prefill must reproduce the full forward pass, with sequences longer than the sliding window and the chunk. The
full-size workloads are only traced (jax.eval_shape / jax.make_jaxpr over ShapeDtypeStructs).
"""

from __future__ import annotations

import functools
import math
import pathlib
import time

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from serving.architecture import ModelArchitecture
from serving.architecture_parts import RopeScaling
from serving.models import build_model, common, moe
from serving.models.gqa import GQATransformer

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKLOADS = sorted(ROOT.glob("conf/workload/*.yaml"))
GQA_WORKLOADS = [p for p in WORKLOADS if yaml.safe_load(p.read_text())["family"] == "gqa"]
T, B = 11, 2  # longer than the window (4) and the chunk (4) of the tiny configs

BASE = dict(num_layers=2, hidden_size=64, vocab_size=97, norm_eps=1e-5, max_position_embeddings=64,
            rope_theta=10000.0, num_attention_heads=4, num_kv_heads=2, head_dim=16)
TINY = {
    "llama3": dict(name="tiny_llama3", family="gqa", intermediate_size=96,
                   rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=16)),
    "gpt_oss": dict(name="tiny_gpt_oss", family="gqa", attention_bias=True, o_bias=True, attention_sinks=True,
                    attention_pattern=["sliding", "full"], sliding_window=4, num_experts=4, experts_per_token=2,
                    expert_intermediate_size=48, expert_bias=True, swiglu_limit=1.0, router="topk_softmax",
                    router_bias=True,
                    rope_scaling=dict(type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                      original_max_position_embeddings=256, truncate=False)),
    "qwen3_moe": dict(name="tiny_qwen3", family="gqa", qk_norm="rmsnorm", num_experts=8, experts_per_token=2,
                      expert_intermediate_size=32, router="softmax_topk", router_normalize_topk=True,
                      intermediate_size=96),
    # Llama 4's pattern is [chunked x3, full]; [chunked, full] keeps both layer kinds (and MoE on layer 1) in
    # 2 layers. qk_norm l2 is Scout's (Maverick: none), enabled here to exercise it.
    "llama4": dict(name="tiny_llama4", family="gqa", qk_norm="l2", attention_pattern=["chunked", "full"],
                   rope_pattern=[True, False], attention_chunk_size=4, intermediate_size=96,
                   num_experts=4, experts_per_token=1, expert_intermediate_size=48, num_shared_experts=1,
                   shared_expert_intermediate_size=48, moe_layer_step=2, router="topk_sigmoid"),
}
FLOOR_SCALE = 3.0  # Llama 4 temperature tuning floor_scale shrunk from 8192 so that 11 tokens exercise it


def tiny_arch(kind: str) -> ModelArchitecture:
    return ModelArchitecture.from_dict(BASE | TINY[kind])


def tiny_model(kind: str) -> GQATransformer:
    return GQATransformer(tiny_arch(kind), attn_temperature_floor_scale=FLOOR_SCALE)


def test_params(model, seed=0):
    """Weights at O(1) activation scale (1/sqrt(fan_in)), norms 1 + noise, so every path matters numerically.
    Drawn with NumPy in the tree ``model.init`` builds (traced with eval_shape: nothing compiled)."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    rng = np.random.default_rng(seed)
    out = []
    for path, leaf in leaves:
        name = str(path[-1]).strip("[]'\"")
        z = rng.standard_normal(leaf.shape)
        if "norm" in name:
            z = 1.0 + 0.2 * z
        elif name in ("embed", "sinks"):
            pass
        elif len(leaf.shape) >= 2:
            z = z / math.sqrt(leaf.shape[-2])
        else:
            z = 0.3 * z
        out.append(jnp.asarray(z, jnp.float32))
    return jax.tree_util.tree_unflatten(treedef, out)


test_params.__test__ = False


def tokens_for(vocab, b=B, t=T, seed=3):
    return jax.random.randint(jax.random.PRNGKey(seed), (b, t), 0, vocab)


# ====================================================================== independent NumPy reference
def ref_inv_freq(theta, scaling, d):
    """Per rotary pair, by formula. llama3: Meta's llama-models ``apply_scaling``; YaRN: OpenAI gpt-oss
    ``_compute_concentration_and_inv_freq`` (truncate false) or DeepSeek ``find_correction_range`` (floor/ceil).
    transformers also clamps the ramp ends to [0, d - 1], which OpenAI's code does not; the tiny gpt-oss config
    (original context 256: ramp over dims 0.2 .. 3.2) and the published ones (8.1 .. 17.4) stay inside."""
    out, concentration = [], 1.0
    for i in range(d // 2):
        f = theta ** (-2.0 * i / d)
        if scaling is None:
            out.append(f)
            continue
        old, factor = scaling.original_max_position_embeddings, scaling.factor
        if scaling.type == "llama3":
            wavelen = 2 * math.pi / f
            if wavelen < old / scaling.high_freq_factor:
                out.append(f)
            elif wavelen > old / scaling.low_freq_factor:
                out.append(f / factor)
            else:
                lo, hi = scaling.low_freq_factor, scaling.high_freq_factor
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append((1 - smooth) * f / factor + smooth * f)
        else:
            concentration = 0.1 * math.log(factor) + 1.0
            d_half = d / 2
            low = d_half * math.log(old / (scaling.beta_fast * 2 * math.pi)) / math.log(theta)
            high = d_half * math.log(old / (scaling.beta_slow * 2 * math.pi)) / math.log(theta)
            if scaling.truncate is not False:
                low, high = max(math.floor(low), 0), min(math.ceil(high), d - 1)
            keep = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
            out.append(f / factor * (1 - keep) + f * keep)
    return np.array(out), concentration


def ref_rope(x, pos, inv, conc, interleaved):
    """x [T, H, d] rotated pair by pair."""
    y = x.copy()
    d = x.shape[-1]
    for t in range(x.shape[0]):
        for i in range(d // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
            c, s = math.cos(pos[t] * inv[i]) * conc, math.sin(pos[t] * inv[i]) * conc
            y[t, :, a] = x[t, :, a] * c - x[t, :, b] * s
            y[t, :, b] = x[t, :, b] * c + x[t, :, a] * s
    return y


def ref_rms(x, w, eps):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def ref_attention(q, k, v, qpos, kpos, kind, window, chunk, sinks, scale):
    """q [Tq, Hq, d], k/v [Tk, Hkv, d]: one query and one head at a time."""
    tq, hq, _ = q.shape
    g = hq // k.shape[1]
    out = np.zeros((tq, hq, v.shape[-1]))
    for j in range(hq):
        for t in range(tq):
            visible = [s for s in range(k.shape[0]) if kpos[s] <= qpos[t]
                       and (kind != "sliding" or kpos[s] > qpos[t] - window)
                       and (kind != "chunked" or kpos[s] // chunk == qpos[t] // chunk)]
            logits = np.array([q[t, j] @ k[s, j // g] * scale for s in visible])
            m = logits.max() if sinks is None else max(logits.max(), sinks[j])
            e = np.exp(logits - m)
            denom = e.sum() + (0.0 if sinks is None else math.exp(sinks[j] - m))
            out[t, j] = sum(e[n] / denom * v[s, j // g] for n, s in enumerate(visible))
    return out


def ref_route(logit, arch, correction_bias=None):
    """One token's (weights, experts) by the router's formula."""
    k = arch.experts_per_token
    order = list(np.argsort(-logit, kind="stable"))
    if arch.router == "softmax_topk":
        p = np.exp(logit - logit.max())
        p /= p.sum()
        chosen = list(np.argsort(-p, kind="stable")[:k])
        w = p[chosen] / (p[chosen].sum() if arch.router_normalize_topk else 1.0)
    elif arch.router == "topk_softmax":
        chosen = order[:k]
        e = np.exp(logit[chosen] - logit[chosen].max())
        w = e / e.sum()
    elif arch.router == "topk_sigmoid":
        chosen = order[:k]
        w = 1 / (1 + np.exp(-logit[chosen]))
    else:  # sigmoid_grouped
        s = 1 / (1 + np.exp(-logit))
        biased = s + (0 if correction_bias is None else correction_bias)
        size = len(s) // arch.n_group
        gscore = [sorted(biased[g * size:(g + 1) * size])[-2:] for g in range(arch.n_group)]
        groups = sorted(range(arch.n_group), key=lambda g: -sum(gscore[g]))[:arch.topk_group]
        allowed = [e for e in range(len(s)) if e // size in groups]
        chosen = sorted(allowed, key=lambda e: -biased[e])[:k]
        w = s[chosen]
        if arch.router_normalize_topk:
            w = w / w.sum()
    return np.asarray(w) * arch.routed_scaling_factor, list(chosen)


def ref_expert(x, e, ex, arch):
    gate, up = x @ ex["w_gate"][e], x @ ex["w_up"][e]
    if "b_gate" in ex:
        gate, up = gate + ex["b_gate"][e], up + ex["b_up"][e]
    if arch.swiglu_limit is not None:  # gpt-oss GptOssExperts
        gate = np.minimum(gate, arch.swiglu_limit)
        up = np.clip(up, -arch.swiglu_limit, arch.swiglu_limit)
        act = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
    else:
        act = gate / (1 + np.exp(-gate)) * up
    y = act @ ex["w_down"][e]
    return y + ex["b_down"][e] if "b_down" in ex else y


def ref_moe(x, lp, arch):
    """x [N, h]: one token and one chosen expert at a time."""
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        logit = x[t] @ lp["router"]["w"] + lp["router"].get("b", 0.0)
        weights, chosen = ref_route(logit, arch, lp["router"].get("correction_bias"))
        for w, e in zip(weights, chosen):
            if arch.router == "topk_sigmoid":  # Llama 4: score scales the expert input
                out[t] += ref_expert(x[t] * w, e, lp["experts"], arch)
            else:
                out[t] += w * ref_expert(x[t], e, lp["experts"], arch)
        if "shared" in lp:
            s = lp["shared"]
            g = x[t] @ s["w_gate"]
            out[t] += (g / (1 + np.exp(-g)) * (x[t] @ s["w_up"])) @ s["w_down"]
    return out


def ref_forward(arch, params, tokens, floor_scale=FLOOR_SCALE):
    P = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    tokens = np.asarray(tokens)
    nh, nkv, d, eps = arch.num_attention_heads, arch.num_kv_heads, arch.head_dim, arch.norm_eps
    inv, conc = ref_inv_freq(arch.rope_theta, arch.rope_scaling, d)
    interleaved = not all(arch.rope_pattern)  # Llama 4
    logits = []
    for b in range(tokens.shape[0]):
        x = P["embed"][tokens[b]]
        pos = np.arange(tokens.shape[1])
        for i, lp in enumerate(P["layers"]):
            kind = arch.layer_kinds()[i]
            a = lp["attn"]
            hn = ref_rms(x, lp["attn_norm"], eps)
            q = (hn @ a["wq"] + a.get("bq", 0)).reshape(-1, nh, d)
            k = (hn @ a["wk"] + a.get("bk", 0)).reshape(-1, nkv, d)
            v = (hn @ a["wv"] + a.get("bv", 0)).reshape(-1, nkv, d)
            if arch.qk_norm == "rmsnorm":
                q, k = ref_rms(q, a["q_norm"], eps), ref_rms(k, a["k_norm"], eps)
            if kind.rope:
                q, k = ref_rope(q, pos, inv, conc, interleaved), ref_rope(k, pos, inv, conc, interleaved)
                if arch.qk_norm == "l2":
                    q, k = ref_rms(q, None, eps), ref_rms(k, None, eps)
            else:  # Llama 4 NoPE layer temperature tuning
                q = q * (np.log(np.floor((pos + 1.0) / floor_scale) + 1.0) * 0.1 + 1.0)[:, None, None]
            o = ref_attention(q, k, v, pos, pos, kind.attention, arch.sliding_window, arch.attention_chunk_size,
                              a.get("sinks"), d ** -0.5)
            x = x + o.reshape(len(pos), -1) @ a["wo"] + a.get("bo", 0)
            hn = ref_rms(x, lp["ffn_norm"], eps)
            if "mlp" in lp:
                m = lp["mlp"]
                g = hn @ m["w_gate"]
                x = x + (g / (1 + np.exp(-g)) * (hn @ m["w_up"])) @ m["w_down"]
            else:
                x = x + ref_moe(hn, lp, arch)
        x = ref_rms(x, P["final_norm"], eps)
        logits.append(x @ (P["lm_head"] if "lm_head" in P else P["embed"].T))
    return np.stack(logits)


# ====================================================================== building blocks
@pytest.mark.parametrize("kind", ["llama3", "gpt_oss"])
def test_rope_frequencies_match_formula(kind):
    arch = tiny_arch(kind)
    inv, conc = common.rope_inv_freq(arch.rope_theta, arch.rope_scaling, 16)
    ref, ref_conc = ref_inv_freq(arch.rope_theta, arch.rope_scaling, 16)
    np.testing.assert_allclose(inv, ref, rtol=1e-12)
    assert conc == pytest.approx(ref_conc)


def test_rope_scaling_published_values():
    # gpt-oss: concentration 0.1 ln 32 + 1; the fastest dims are kept, the slowest interpolated by the factor
    inv, conc = common.rope_inv_freq(150000.0, RopeScaling(type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                                           original_max_position_embeddings=4096, truncate=False), 64)
    assert conc == pytest.approx(1.3465735902799727)
    plain = 150000.0 ** (-np.arange(0, 64, 2) / 64)
    assert inv[0] == plain[0] and inv[-1] == pytest.approx(plain[-1] / 32)
    # DeepSeek-V3: mscale == mscale_all_dim -> cos/sin unscaled, softmax scale times (0.1 ln 40 + 1)^2
    ds = RopeScaling(type="yarn", factor=40.0, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                     original_max_position_embeddings=4096)
    assert common.rope_inv_freq(10000.0, ds, 64)[1] == 1.0
    assert common.deepseek_softmax_mscale(ds) == pytest.approx(0.1 * math.log(40) + 1)
    np.testing.assert_allclose(common.rope_inv_freq(10000.0, ds, 64)[0], ref_inv_freq(10000.0, ds, 64)[0], rtol=1e-12)
    # Llama 3.1: wavelengths above 8192 divided by 8, below 2048 unchanged
    l3 = RopeScaling(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)
    inv, _ = common.rope_inv_freq(500000.0, l3, 128)
    plain = 500000.0 ** (-np.arange(0, 128, 2) / 128)
    wl = 2 * np.pi / plain
    np.testing.assert_allclose(inv[wl < 2048], plain[wl < 2048])
    np.testing.assert_allclose(inv[wl > 8192], plain[wl > 8192] / 8)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rope_matches_formula(interleaved):
    x = np.random.default_rng(0).normal(size=(5, 3, 8))
    pos = np.array([0, 1, 2, 7, 30])
    inv = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    cos, sin, _ = common.rope_frequencies(10000.0, 8, jnp.asarray(pos))
    got = common.apply_rope(jnp.asarray(x, jnp.float32), cos, sin, interleaved)
    np.testing.assert_allclose(got, ref_rope(x, pos, inv, 1.0, interleaved), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,sinks", [("full", False), ("sliding", True), ("chunked", False), ("full", True)])
def test_attention_matches_loops(kind, sinks):
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(1, 9, 4, 8)), rng.normal(size=(1, 9, 2, 8)), rng.normal(size=(1, 9, 2, 6))
    s = rng.normal(size=4) * 2 if sinks else None
    pos = np.arange(9)
    got = common.attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), q_positions=jnp.arange(9),
                           k_positions=jnp.arange(9), kind=kind, window=3, chunk=4,
                           sinks=None if s is None else jnp.asarray(s, jnp.float32), scale=0.3)
    want = ref_attention(q[0], k[0], v[0], pos, pos, kind, 3, 4, s, 0.3)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


ROUTER_ARCHS = {
    "softmax_topk": dict(router="softmax_topk", router_normalize_topk=True),
    "softmax_topk_raw": dict(router="softmax_topk"),
    "topk_softmax": dict(router="topk_softmax"),
    "topk_sigmoid": dict(router="topk_sigmoid"),
    "sigmoid_grouped": dict(router="sigmoid_grouped", router_normalize_topk=True, n_group=4, topk_group=2,
                            routed_scaling_factor=2.5),
    "sigmoid_single_group": dict(router="sigmoid_grouped", router_normalize_topk=True, n_group=1, topk_group=1,
                                 routed_scaling_factor=2.827),
}


@pytest.mark.parametrize("name", list(ROUTER_ARCHS))
def test_route_matches_formula(name):
    arch = ModelArchitecture.from_dict(BASE | dict(name="r", family="gqa", num_experts=16, experts_per_token=3,
                                                   expert_intermediate_size=8) | ROUTER_ARCHS[name])
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(7, 16))
    bias = rng.normal(size=16) * 0.3 if arch.router == "sigmoid_grouped" else None
    w, idx = moe.route(jnp.asarray(logits, jnp.float32), router=arch.router, top_k=3, n_group=arch.n_group,
                       topk_group=arch.topk_group, routed_scaling_factor=arch.routed_scaling_factor,
                       correction_bias=None if bias is None else jnp.asarray(bias, jnp.float32),
                       normalize_topk=arch.router_normalize_topk)
    assert idx.dtype == jnp.int32 and w.dtype == jnp.float32
    for t in range(7):
        rw, rc = ref_route(logits[t], arch, bias)
        assert list(np.asarray(idx[t])) == rc
        np.testing.assert_allclose(w[t], rw, rtol=1e-5)


@pytest.mark.parametrize("kind", ["gpt_oss", "llama4"])
def test_grouped_experts_match_token_loop(kind):
    model = tiny_model(kind)
    arch = model.arch
    lp = next(lp for lp in test_params(model)["layers"] if "experts" in lp)
    x = np.random.default_rng(4).normal(size=(13, 64))
    got = jax.jit(model._moe)(lp, jnp.asarray(x, jnp.float32)[None])[0]
    want = ref_moe(x, jax.tree.map(lambda a: np.asarray(a, np.float64), lp), arch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ====================================================================== whole models
@functools.lru_cache(maxsize=None)
def setup(kind):
    model = tiny_model(kind)
    params = test_params(model)
    tokens = tokens_for(model.arch.vocab_size)
    forward = jax.jit(model.forward)
    return model, params, tokens, np.asarray(forward(params, tokens)), forward


@pytest.mark.parametrize("kind", list(TINY))
def test_forward_matches_reference(kind):
    model, params, tokens, logits, _ = setup(kind)
    want = ref_forward(model.arch, params, tokens)
    assert logits.shape == (B, T, model.arch.vocab_size)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", list(TINY))
def test_decode_after_prefill_equals_forward(kind):
    model, params, tokens, logits, _ = setup(kind)
    prefill, decode = jax.jit(model.prefill), jax.jit(model.decode)
    tol = dict(rtol=1e-5, atol=1e-5 * np.abs(logits).max())
    # prefill T-1 tokens, decode the last; the serving prefill returns the last position's logits only
    every, _ = jax.jit(functools.partial(model.prefill, all_logits=True))(
        params, tokens[:, :-1], model.init_cache(B, 16, jnp.float32))
    np.testing.assert_allclose(every, logits[:, :-1], **tol)
    out, cache = prefill(params, tokens[:, :-1], model.init_cache(B, 16, jnp.float32))
    assert out.shape == (B, 1, logits.shape[-1])
    np.testing.assert_allclose(out, logits[:, T - 2:T - 1], **tol)
    step, cache = decode(params, tokens[:, -1:], cache)
    np.testing.assert_allclose(step[:, 0], logits[:, -1], **tol)
    assert int(cache["length"]) == T
    # T decode steps from an empty cache (same compiled step): every window / chunk boundary is crossed in cache
    cache = model.init_cache(B, 16, jnp.float32)
    for t in range(T):
        step, cache = decode(params, tokens[:, t:t + 1], cache)
        np.testing.assert_allclose(step[:, 0], logits[:, t], **tol)


def test_sinks_change_the_output():
    model, params, tokens, logits, forward = setup("gpt_oss")
    no_sink = jax.tree_util.tree_map_with_path(
        lambda p, a: jnp.full_like(a, -1e30) if "sinks" in str(p[-1]) else a, params)
    zero_sink = jax.tree_util.tree_map_with_path(
        lambda p, a: jnp.zeros_like(a) if "sinks" in str(p[-1]) else a, params)
    out_none = np.asarray(forward(no_sink, tokens))
    assert np.abs(out_none - logits).max() > 1e-2 * np.abs(logits).max()
    assert np.abs(np.asarray(forward(zero_sink, tokens)) - out_none).max() > 1e-3 * np.abs(logits).max()
    # an effectively -inf sink is plain attention: the reference without sinks agrees
    arch = model.arch
    plain = jax.tree.map(lambda a: a, no_sink)  # a copy without the sinks
    for lp in plain["layers"]:
        del lp["attn"]["sinks"]
    np.testing.assert_allclose(out_none, ref_forward(arch, plain, tokens), rtol=1e-5,
                               atol=1e-5 * np.abs(out_none).max())


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _all_eqns(sub)


def test_moe_layer_is_grouped():
    arch = ModelArchitecture.from_dict(BASE | TINY["qwen3_moe"] | dict(num_experts=16))
    model = GQATransformer(arch)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    n_tok, e, h = 32, 16, 64
    x = jax.ShapeDtypeStruct((1, n_tok, h), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda lp, x: model._layer(0, lp, x, jnp.arange(n_tok))[0])(params["layers"][0], x)
    names = [eqn.primitive.name for eqn in _all_eqns(jaxpr.jaxpr)]
    assert sum("ragged_dot" in n for n in names) == 3  # gate, up, down
    biggest = max(int(np.prod(v.aval.shape)) for eqn in _all_eqns(jaxpr.jaxpr) for v in eqn.outvars)
    assert biggest < n_tok * e * h  # no dense [T, E, h] dispatch


def _composed_stacks(jaxpr, prefix=""):
    """Every equation's name stack composed through the jitted blocks it sits in (as the graph walker reads it)."""
    for eqn in jaxpr.eqns:
        stack = "/".join(s for s in (prefix, str(eqn.source_info.name_stack)) if s)
        yield stack
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _composed_stacks(sub, stack)


def test_named_scopes():
    model, params, tokens, _, _ = setup("llama4")
    jaxpr = jax.make_jaxpr(model.forward)(params, tokens)
    stacks = set(_composed_stacks(jaxpr.jaxpr))
    for scope in ("embed", "final_norm", "lm_head", "layer_0/attn_norm", "layer_0/qkv_proj", "layer_0/attention",
                  "layer_0/o_proj", "layer_0/ffn_norm", "layer_0/mlp", "layer_1/router", "layer_1/experts",
                  "layer_1/shared_expert"):
        assert any(s == scope or s.startswith(scope + "/") for s in stacks), scope


# ====================================================================== full-size workloads, traced only
@pytest.mark.parametrize("path", GQA_WORKLOADS, ids=lambda p: p.stem)
def test_full_size_trace(path):
    arch = ModelArchitecture.from_dict(yaml.safe_load(path.read_text()))
    model = build_model(arch)
    shapes = jax.eval_shape(functools.partial(model.init, dtype=jnp.bfloat16), jax.random.PRNGKey(0))
    # param_counts() has no MTP or vision for these models, so the tree holds exactly total_params
    assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(shapes)) == arch.total_params == model.num_params()
    cache = jax.eval_shape(lambda: model.init_cache(1, 128, jnp.bfloat16))
    start = time.perf_counter()
    jaxpr = jax.make_jaxpr(model.decode)(shapes, jax.ShapeDtypeStruct((1, 1), jnp.int32), cache)
    # measured on CPU: 0.5 s (llama3_8b) to 2.4 s (qwen3_235b_a22b, 94 layers)
    assert time.perf_counter() - start < 30
    assert jaxpr.out_avals[0].shape == (1, 1, arch.vocab_size)
