"""Grouped-query-attention decoder transformers, dense or MoE: Llama 2/3, gpt-oss, Qwen3 MoE, Llama 4 Maverick.

One class, :class:`GQATransformer`, driven by the :class:`~serving.architecture.ModelArchitecture` fields; the
parameter tree, named scopes and model API follow ``serving/models/__init__.py``. Per model (transformers
``modeling_llama.py``, ``modeling_gpt_oss.py``, ``modeling_qwen3_moe.py``, ``modeling_llama4.py``):

- Llama 2/3: pre-norm RMSNorm blocks, q/k/v/o without bias, half-split ("rotate_half") RoPE (Llama 3.1: llama3
  frequency scaling), SwiGLU FFN, untied lm_head.
- gpt-oss: q/k/v/o biases; a learned sink logit per head; ``attention_pattern [sliding, full]`` (window 128);
  YaRN RoPE (cos/sin times 0.1 ln 32 + 1), half-split; router linear with bias, top-k then softmax; experts with
  biases and the clamped SwiGLU (``swiglu_limit`` 7, alpha 1.702, ``(up + 1) * glu``).
- Qwen3 MoE: RMSNorm over head_dim of each q and k head *before* RoPE (``q_norm`` / ``k_norm``); softmax over all
  experts, top-k, renormalised when ``router_normalize_topk``.
- Llama 4: interleaved (complex-pair) RoPE on the chunked layers, none on the global ones (``rope_pattern``);
  the weightless qk norm (``qk_norm: l2``) *after* RoPE and only on RoPE layers (Llama4TextAttention builds
  ``qk_norm`` only when ``use_rope``); attention temperature tuning on the NoPE layers
  (``q *= log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1``, Llama4TextConfig defaults floor_scale 8192,
  attn_scale 0.1; they are not ModelArchitecture fields, so they are constructor arguments here); MoE every
  ``moe_layer_step``-th layer: sigmoid(top-1 logit) multiplies the expert *input* (Llama4TextMoe), plus one
  shared expert added to the routed output.

Parameters (``init``): ``embed [V, h]``, ``lm_head [h, V]`` (absent when tied), ``final_norm [h]``, per layer
``attn_norm``, ``attn {wq [h, Hq*d], wk, wv [h, Hkv*d], wo [Hq*d, h], bq/bk/bv/bo (biases), q_norm/k_norm [d],
sinks [Hq]}``, ``ffn_norm`` and either ``mlp {w_gate, w_up [h, f], w_down [f, h]}`` or ``router {w [h, E], b [E]}``,
``experts {w_gate, w_up [E, h, f], w_down [E, f, h], b_gate, b_up [E, f], b_down [E, h]}`` and ``shared`` (an
``mlp`` of width ``num_shared_experts x shared_expert_intermediate_size``). Linear weights are stored
``[in, out]`` (the transpose of torch's ``nn.Linear.weight``); the counts equal ``arch.param_counts()``.

Kernel scopes: ``qkv_proj`` covers the projections, biases, qk norm, RoPE and Llama 4's temperature;
``attention`` covers the cache write and the masked softmax attention.

Cache (``init_cache``): ``{"layers": [{"k", "v": [B, max_len, Hkv, d]}], "length": int32 scalar}``, contiguous on
every layer (sliding and chunked layers mask by position rather than keeping a ring buffer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from serving.models.common import apply_rope, attention, l2_norm, rms_norm, rope_frequencies
from serving.models.moe import grouped_expert_ffn, route, swiglu_ffn


class GQATransformer:
    """Executable GQA model of ``arch`` (family ``gqa``). All methods are jittable; the config is static."""

    def __init__(self, arch, *, attn_temperature_floor_scale: float = 8192.0, attn_temperature_scale: float = 0.1):
        if arch.family != "gqa":
            raise ValueError(f"GQATransformer needs family 'gqa', got {arch.family!r}")
        self.arch = arch
        self.kinds = arch.layer_kinds()
        self.floor_scale, self.attn_scale = attn_temperature_floor_scale, attn_temperature_scale
        # Llama 4 (the only model with NoPE layers) uses interleaved complex-pair RoPE; the others rotate_half.
        self.nope_model = not all(arch.rope_pattern)
        self.interleaved_rope = self.nope_model
        self._init_jit = jax.jit(self._init, static_argnums=1)
        # One decoder block as its own jitted function, keyed by the layer kind: identical layers (all 80 of Llama 3
        # 70B, the two alternating kinds of gpt-oss) are traced once per shape and reused, which makes full-size
        # tracing several times cheaper; under an outer jit it is inlined, so execution is unchanged.
        self._block_jit = jax.jit(self._block, static_argnums=(0, 1))

    # ================================================================== parameters
    def param_shapes(self) -> dict:
        """The parameter tree with ``(shape, init)`` leaves, init one of ``normal`` / ``ones``."""
        a = self.arch
        h, d, hq, hkv = a.hidden_size, a.head_dim, a.num_attention_heads, a.num_kv_heads
        w = lambda *s: (s, "normal")  # noqa: E731
        ones = lambda *s: (s, "ones")  # noqa: E731
        params = {"embed": w(a.vocab_size, h), "final_norm": ones(h), "layers": []}
        if not a.tie_word_embeddings:
            params["lm_head"] = w(h, a.vocab_size)
        for kind in self.kinds:
            attn = {"wq": w(h, hq * d), "wk": w(h, hkv * d), "wv": w(h, hkv * d), "wo": w(hq * d, h)}
            if a.attention_bias:
                attn |= {"bq": w(hq * d), "bk": w(hkv * d), "bv": w(hkv * d)}
            if a.o_bias:
                attn["bo"] = w(h)
            if a.qk_norm == "rmsnorm":
                attn |= {"q_norm": ones(d), "k_norm": ones(d)}
            if a.attention_sinks:
                attn["sinks"] = w(hq)
            layer = {"attn_norm": ones(h), "attn": attn, "ffn_norm": ones(h)}
            if kind.ffn == "dense":
                f = a.intermediate_size
                layer["mlp"] = {"w_gate": w(h, f), "w_up": w(h, f), "w_down": w(f, h)}
            else:
                e, f = a.num_experts, a.expert_intermediate_size
                layer["router"] = {"w": w(h, e)} | ({"b": w(e)} if a.router_bias else {})
                if a.router_score_correction_bias:
                    layer["router"]["correction_bias"] = w(e)
                experts = {"w_gate": w(e, h, f), "w_up": w(e, h, f), "w_down": w(e, f, h)}
                if a.expert_bias:
                    experts |= {"b_gate": w(e, f), "b_up": w(e, f), "b_down": w(e, h)}
                layer["experts"] = experts
                if a.num_shared_experts:
                    fs = a.num_shared_experts * a.shared_expert_intermediate_size
                    layer["shared"] = {"w_gate": w(h, fs), "w_up": w(h, fs), "w_down": w(fs, h)}
            params["layers"].append(layer)
        return params

    def init(self, key, dtype=jnp.float32):
        """Random weights: ``normal * 0.02`` (biases and sinks too, so that tests exercise them), norms 1. One jitted
        computation (eager per-leaf draws would compile once per shape); use ``jax.eval_shape`` at full size."""
        return self._init_jit(key, jnp.dtype(dtype))

    def _init(self, key, dtype):
        specs = self.param_shapes()
        leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
        keys = jax.random.split(key, len(leaves))
        out = [jnp.ones(shape, dtype) if how == "ones"
               else (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype)
               for k, (shape, how) in zip(keys, leaves)]
        return jax.tree.unflatten(treedef, out)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32):
        a = self.arch
        shape = (batch, max_len, a.num_kv_heads, a.head_dim)
        return {"layers": [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in self.kinds],
                "length": jnp.zeros((), jnp.int32)}

    # ================================================================== blocks
    def _qkv(self, kind, p, x, positions):
        """q [B, T, Hq, d], k, v [B, T, Hkv, d] of a layer of ``kind`` (projections, biases, qk norm, RoPE,
        temperature)."""
        a = self.arch
        b, t, _ = x.shape
        d = a.head_dim

        def proj(name, bias, heads):
            y = jnp.dot(x, p[name], preferred_element_type=jnp.float32)
            if bias in p:
                y = y + p[bias].astype(jnp.float32)
            return y.astype(x.dtype).reshape(b, t, heads, d)

        q = proj("wq", "bq", a.num_attention_heads)
        k, v = proj("wk", "bk", a.num_kv_heads), proj("wv", "bv", a.num_kv_heads)
        if a.qk_norm == "rmsnorm":  # Qwen3MoeAttention: q_norm / k_norm over head_dim, before RoPE
            q, k = rms_norm(q, p["q_norm"], a.norm_eps), rms_norm(k, p["k_norm"], a.norm_eps)
        if kind.rope:
            cos, sin, _ = rope_frequencies(a, d, positions)
            q, k = apply_rope(q, cos, sin, self.interleaved_rope), apply_rope(k, cos, sin, self.interleaved_rope)
            if a.qk_norm == "l2":  # Llama4TextAttention: after RoPE, RoPE layers only
                q, k = l2_norm(q, a.norm_eps), l2_norm(k, a.norm_eps)
        elif self.nope_model:  # Llama 4 attn_temperature_tuning on the NoPE (global) layers
            pos = positions.astype(jnp.float32)
            temp = jnp.log(jnp.floor((pos + 1.0) / self.floor_scale) + 1.0) * self.attn_scale + 1.0
            q = (q.astype(jnp.float32) * temp[..., :, None, None]).astype(q.dtype)
        return q, k, v

    def _attention(self, kind, p, x, positions, cache_layer, length, fresh):
        """Attention sub-block (after attn_norm). With a ``cache_layer`` the new K/V are written at ``length``.
        ``fresh``: attend over the new keys only (forward; prefill into an empty cache), else over the whole cache
        with unused slots masked (decode). Returns (out, cache_layer)."""
        a = self.arch
        with jax.named_scope("qkv_proj"):
            q, k, v = self._qkv(kind, p, x, positions)
        with jax.named_scope("attention"):
            common = dict(kind=kind.attention, window=a.sliding_window, chunk=a.attention_chunk_size,
                          sinks=p.get("sinks"), scale=a.head_dim ** -0.5)
            if cache_layer is not None:
                cache_layer = {name: jax.lax.dynamic_update_slice_in_dim(
                    cache_layer[name], new.astype(cache_layer[name].dtype), length, 1)
                    for name, new in (("k", k), ("v", v))}
            if fresh:
                o = attention(q, k, v, q_positions=positions, k_positions=positions, **common)
            else:
                ck, cv = cache_layer["k"].astype(q.dtype), cache_layer["v"].astype(q.dtype)
                slots = jnp.arange(ck.shape[1])
                o = attention(q, ck, cv, q_positions=positions, k_positions=slots,
                              k_valid=slots < length + x.shape[1], **common)
        with jax.named_scope("o_proj"):
            b, t = x.shape[:2]
            y = jnp.dot(o.reshape(b, t, -1), p["wo"], preferred_element_type=jnp.float32)
            if "bo" in p:
                y = y + p["bo"].astype(jnp.float32)
        return y.astype(x.dtype), cache_layer

    def _moe(self, lp, x):
        """Routed experts (+ shared expert) of one MoE layer on ``x [B, T, h]`` (after ffn_norm)."""
        a = self.arch
        b, t, h = x.shape
        flat = x.reshape(b * t, h)
        with jax.named_scope("router"):
            r = lp["router"]
            logits = jnp.dot(flat, r["w"], preferred_element_type=jnp.float32)
            if "b" in r:
                logits = logits + r["b"].astype(jnp.float32)
            weights, indices = route(logits, router=a.router, top_k=a.experts_per_token, n_group=a.n_group,
                                     topk_group=a.topk_group, routed_scaling_factor=a.routed_scaling_factor,
                                     correction_bias=r.get("correction_bias"),
                                     normalize_topk=a.router_normalize_topk)
        with jax.named_scope("experts"):
            e = lp["experts"]
            out = grouped_expert_ffn(flat, weights, indices, e["w_gate"], e["w_up"], e["w_down"],
                                     b_gate=e.get("b_gate"), b_up=e.get("b_up"), b_down=e.get("b_down"),
                                     activation="swiglu_clamped" if a.swiglu_limit is not None else "swiglu",
                                     swiglu_limit=a.swiglu_limit, scale_input=a.router == "topk_sigmoid")
        if "shared" in lp:
            with jax.named_scope("shared_expert"):
                s = lp["shared"]
                out = out + swiglu_ffn(flat, s["w_gate"], s["w_up"], s["w_down"])
        return out.reshape(b, t, h)

    def _layer(self, i, lp, x, positions, cache_layer=None, length=0, fresh=True):
        with jax.named_scope(f"layer_{i}"):
            return self._block_jit(self.kinds[i], fresh, lp, x, positions, cache_layer, length)

    def _block(self, kind, fresh, lp, x, positions, cache_layer, length):
        """One pre-norm decoder block of ``kind``: x + attn(attn_norm(x)), then + ffn(ffn_norm(x))."""
        a = self.arch
        with jax.named_scope("attn_norm"):
            hn = rms_norm(x, lp["attn_norm"], a.norm_eps)
        attn_out, cache_layer = self._attention(kind, lp["attn"], hn, positions, cache_layer, length, fresh)
        x = x + attn_out
        with jax.named_scope("ffn_norm"):
            hn = rms_norm(x, lp["ffn_norm"], a.norm_eps)
        if "mlp" in lp:
            with jax.named_scope("mlp"):
                m = lp["mlp"]
                ffn_out = swiglu_ffn(hn, m["w_gate"], m["w_up"], m["w_down"])
        else:
            ffn_out = self._moe(lp, hn)
        return x + ffn_out, cache_layer

    def _embed(self, params, tokens):
        with jax.named_scope("embed"):
            return jnp.take(params["embed"], tokens, axis=0)

    def _head(self, params, x, last_only=False):
        with jax.named_scope("final_norm"):
            x = rms_norm(x, params["final_norm"], self.arch.norm_eps)
        with jax.named_scope("lm_head"):
            x = x[:, -1:] if last_only else x
            w = params["lm_head"] if "lm_head" in params else params["embed"].T
            return jnp.dot(x, w, preferred_element_type=jnp.float32)

    # ================================================================== model API
    def forward(self, params, tokens):
        """Full causal pass without a cache: ``tokens [B, T]`` -> float32 logits ``[B, T, V]``."""
        x = self._embed(params, tokens)
        positions = jnp.arange(tokens.shape[1])
        for i, lp in enumerate(params["layers"]):
            x, _ = self._layer(i, lp, x, positions)
        return self._head(params, x)

    def prefill(self, params, tokens, cache, *, all_logits=False):
        """Process ``tokens [B, T]`` into an empty cache: attention over the prompt itself, K/V written to cache
        positions ``[0, T)``, length set to T. Returns (logits [B, 1, V] of the last position, cache): a serving
        engine samples the first output token from those alone and runs the lm_head on nothing else (vLLM's
        ``logits_indices``, TRT-LLM's ``gather_context_logits`` off by default, SGLang without prompt logprobs).
        ``all_logits``: logits [B, T, V] of every position (prompt log-probabilities)."""
        x = self._embed(params, tokens)
        positions = jnp.arange(tokens.shape[1])
        layers = []
        for i, lp in enumerate(params["layers"]):
            x, c = self._layer(i, lp, x, positions, cache["layers"][i], 0, fresh=True)
            layers.append(c)
        return (self._head(params, x, last_only=not all_logits),
                {"layers": layers, "length": jnp.asarray(tokens.shape[1], jnp.int32)})

    def decode(self, params, tokens, cache):
        """One step (or a few tokens, ``tokens [B, T']``) at the cache's current length: K/V appended, attention
        over the whole cache with unused slots masked. Returns (logits [B, T', V], cache)."""
        length = cache["length"]
        x = self._embed(params, tokens)
        positions = length + jnp.arange(tokens.shape[1])
        layers = []
        for i, lp in enumerate(params["layers"]):
            x, c = self._layer(i, lp, x, positions, cache["layers"][i], length, fresh=False)
            layers.append(c)
        return self._head(params, x), {"layers": layers, "length": length + tokens.shape[1]}

    def num_params(self) -> int:
        """Parameter count of the tree ``init`` builds (no allocation)."""
        return sum(int(np.prod(s)) for s, _ in jax.tree.leaves(self.param_shapes(), is_leaf=_is_spec))


def _is_spec(x) -> bool:
    """A ``(shape, init)`` leaf of :meth:`GQATransformer.param_shapes`."""
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str)
