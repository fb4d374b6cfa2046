"""DeepSeek-V3 / R1 and Kimi K2.5: multi-head latent attention (MLA) with a DeepSeek MoE, the MTP head, and the
Kimi K2.5 vision tower spliced into the token embeddings.

Follows DeepSeek-V3 ``inference/model.py`` (``MLA``, ``Gate``, ``MoE``, ``Block``, ``Transformer``,
``precompute_freqs_cis``, ``apply_rotary_emb``) and transformers ``modeling_deepseek_v3.py``
(``DeepseekV3Attention``, ``DeepseekV3MoE``); the MTP layer follows the DeepSeek-V3 technical report (sec. 2.2),
``README_WEIGHTS.md`` and vLLM ``deepseek_mtp.py`` (``DeepSeekMultiTokenPredictorLayer``).

Attention (per layer, h -> h; H heads, nope/rope/v head dims dn/dr/dv, latent rank r)::

    c_q  = q_a_layernorm(x W_qa)                      # q_a_proj  [h, q_lora]           (model.py: wq_a, q_norm)
    q    = c_q W_qb -> [H, dn + dr]; q_pe = RoPE(q[dn:])  # q_b_proj [q_lora, H(dn+dr)]  (wq_b)
    kv   = x W_kva -> c_kv [r], k_pe [dr]              # kv_a_proj [h, r + dr]           (wkv_a)
    c_kv = kv_a_layernorm(c_kv); k_pe = RoPE(k_pe)     #   one rope key shared by all heads (MQA-style)
    cache <- (c_kv, k_pe)                              #   576 values / token / layer for DeepSeek-V3
    un-absorbed ("naive"): [k_nope, v] = c_kv W_kvb -> [H, dn + dv];  k = [k_nope, k_pe];  softmax(q.k) v
    absorbed:  q_lat = q_nope W_uk^T [H, r];  scores = q_lat . c_kv + q_pe . k_pe;  o_lat = softmax(scores) c_kv;
               o = o_lat W_uv [H, dv]   (W_uk, W_uv: the nope / v rows of W_kvb per head; model.py attn_impl="absorb")
    out  = o W_o                                       # o_proj [H dv, h]                (wo)

The softmax scale is ``(dn + dr)^-0.5 * mscale^2`` with ``mscale = 0.1 * mscale_all_dim * ln(factor) + 1`` under
YaRN (model.py ``MLA.__init__``; transformers ``DeepseekV3Attention``: ``yarn_get_mscale(factor, mscale_all_dim)``).
RoPE is the interleaved (complex-pair) form of model.py ``apply_rotary_emb`` with YaRN-scaled frequencies
(``precompute_freqs_cis``; DeepSeek applies YaRN whenever the serving length exceeds the original 4K, here always
when the config has ``rope_scaling``).

Parameters (``serving/models/__init__.py`` layout): per layer ``attn = {q_a_proj, q_a_layernorm, q_b_proj,
kv_a_proj, kv_a_layernorm, kv_b_proj, o_proj}`` (``[in, out]`` matrices), then either ``mlp = {gate, up, down}``
(the ``first_k_dense_layers``) or ``router = {weight [h, E], correction_bias [E]}``, ``experts = {gate, up [E, h,
f], down [E, f, h]}`` and ``shared = {gate, up, down}`` (width ``num_shared_experts x shared width``);
``mtp = {enorm, hnorm, eh_proj [2h, h], layer, final_norm}`` (``final_norm`` is the MTP's own shared_head.norm,
counted by ``ModelArchitecture.mtp_params``); ``vision`` (:mod:`serving.models.vision`). The counts equal
``ModelArchitecture.param_counts()`` class by class.

Cache: ``{"layers": [{"latent": [B, L, r], "k_rope": [B, L, dr]}, ...], "length": int32 scalar}`` -- only the
normalised latent and the roped shared key, never per-head K/V. ``prefill`` runs the sequence at positions
``[0, T)`` (attention over the T fresh keys) and writes the cache; ``decode`` appends at ``length`` and attends
over all ``L`` slots with the unfilled ones masked, so it traces with a traced ``length``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from serving.models.common import apply_rope, attention, deepseek_softmax_mscale, rms_norm, rope_frequencies
from serving.models.moe import grouped_expert_ffn, route, swiglu_ffn
from serving.models.params import const, materialize, normal


def _linear(x, w):
    """``x @ w`` with float32 accumulation, cast back to ``x.dtype`` (bias-free, as every MLA linear)."""
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _write(layer_cache, latent, k_rope, start):
    """The layer's cache with ``latent [B, T, r]`` and ``k_rope [B, T, dr]`` written at slot ``start``."""
    return {name: jax.lax.dynamic_update_slice(layer_cache[name], value.astype(layer_cache[name].dtype),
                                               (0, start, 0))
            for name, value in (("latent", latent), ("k_rope", k_rope))}


def _in(scope: str, name: str) -> str:
    """``name`` inside ``scope`` (an empty scope: the name itself, for blocks already inside their layer scope)."""
    return f"{scope}/{name}" if scope else name


class MLATransformer:
    """The executable model of a ``family: mla`` :class:`~serving.architecture.ModelArchitecture` (API and
    parameter layout: ``serving/models/__init__.py``)."""

    def __init__(self, arch):
        if arch.family != "mla":
            raise ValueError(f"MLATransformer needs family 'mla', got {arch.family!r}")
        if arch.router not in ("sigmoid_grouped", "none"):
            raise ValueError(f"MLA models route with 'sigmoid_grouped', got {arch.router!r}")
        if arch.num_mtp_layers > 1:  # DeepSeek-V3 ships one MTP module; chained depths are not modelled
            raise ValueError(f"one MTP layer is modelled, got num_mtp_layers = {arch.num_mtp_layers}")
        self.arch = arch
        self.kinds = arch.layer_kinds()
        self.qk_head_dim = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        # model.py MLA.__init__: softmax_scale = qk_head_dim^-0.5, times mscale^2 under YaRN.
        self.softmax_scale = self.qk_head_dim ** -0.5 * deepseek_softmax_mscale(arch.rope_scaling) ** 2
        # One decoder block as its own jitted function (static: absorbed or not): identical layers (the 58 MoE
        # layers of DeepSeek-R1) are traced once per shape and reused, which makes full-size tracing several times
        # cheaper; under an outer jit it is inlined, so execution is unchanged.
        self._block_jit = jax.jit(self._block, static_argnums=0)
        self.vision = None
        if arch.vision is not None:
            from serving.models.vision import VisionEncoder

            self.vision = VisionEncoder(arch.vision)

    # ================================================================== parameters
    def _layer_specs(self, moe: bool) -> dict:
        a = self.arch
        h, H, r, dr = a.hidden_size, a.num_attention_heads, a.kv_lora_rank, a.qk_rope_head_dim
        attn = {}
        if a.q_lora_rank:
            attn["q_a_proj"] = normal((h, a.q_lora_rank), h)
            attn["q_a_layernorm"] = const((a.q_lora_rank,), 1)
            attn["q_b_proj"] = normal((a.q_lora_rank, H * self.qk_head_dim), a.q_lora_rank)
        else:  # DeepSeek-V2-Lite: a plain q projection (model.py wq), kept under the q_b_proj name and scope
            attn["q_b_proj"] = normal((h, H * self.qk_head_dim), h)
        attn["kv_a_proj"] = normal((h, r + dr), h)
        attn["kv_a_layernorm"] = const((r,), 1)
        attn["kv_b_proj"] = normal((r, H * (a.qk_nope_head_dim + a.v_head_dim)), r)
        attn["o_proj"] = normal((H * a.v_head_dim, h), H * a.v_head_dim)
        layer = {"attn_norm": const((h,), 1), "attn": attn, "ffn_norm": const((h,), 1)}
        if not moe:
            f = a.intermediate_size
            layer["mlp"] = {"gate": normal((h, f), h), "up": normal((h, f), h), "down": normal((f, h), f)}
            return layer
        E, f = a.num_experts, a.expert_intermediate_size
        layer["router"] = {"weight": normal((h, E), h)}
        if a.router_score_correction_bias:  # gate.e_score_correction_bias (selection only)
            layer["router"]["correction_bias"] = const((E,), 0)
        layer["experts"] = {"gate": normal((E, h, f), h), "up": normal((E, h, f), h), "down": normal((E, f, h), f)}
        if a.num_shared_experts:  # model.py MoE.shared_experts = MLP(dim, n_shared_experts * moe_inter_dim)
            fs = a.num_shared_experts * a.shared_expert_intermediate_size
            layer["shared"] = {"gate": normal((h, fs), h), "up": normal((h, fs), h), "down": normal((fs, h), fs)}
        return layer

    def param_specs(self) -> dict:
        """The parameter tree as :class:`~serving.models.params.ParamSpec` leaves (shapes and init distributions)."""
        a = self.arch
        h, V = a.hidden_size, a.vocab_size
        specs = {"embed": normal((V, h), 1)}
        specs["layers"] = [self._layer_specs(k.ffn == "moe") for k in self.kinds]
        specs["final_norm"] = const((h,), 1)
        if not a.tie_word_embeddings:
            specs["lm_head"] = normal((h, V), h)
        if a.num_mtp_layers:
            # README_WEIGHTS.md: enorm, hnorm, eh_proj, one decoder layer shaped like the last main layer, and
            # shared_head.norm; shared_head.head and embed_tokens are the main model's.
            specs["mtp"] = {"enorm": const((h,), 1), "hnorm": const((h,), 1), "eh_proj": normal((2 * h, h), 2 * h),
                            "layer": self._layer_specs(a.is_moe_layer(a.num_layers - 1)),
                            "final_norm": const((h,), 1)}
        if self.vision is not None:
            specs["vision"] = self.vision.param_specs()
        return specs

    def init(self, key, dtype=jnp.float32) -> dict:
        """Random parameters (use ``jax.eval_shape(model.init, key)`` at full size)."""
        return materialize(self.param_specs(), key, dtype)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32, num_layers: int | None = None) -> dict:
        """Latent cache: per layer the normalised ``c_kv [B, L, r]`` and the roped ``k_pe [B, L, dr]``."""
        a = self.arch
        n = a.num_layers if num_layers is None else num_layers
        return {"layers": [{"latent": jnp.zeros((batch, max_len, a.kv_lora_rank), dtype),
                            "k_rope": jnp.zeros((batch, max_len, a.qk_rope_head_dim), dtype)} for _ in range(n)],
                "length": jnp.zeros((), jnp.int32)}

    def init_mtp_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
        """The MTP layer's own latent cache (one layer), for :meth:`mtp_draft` run incrementally."""
        return self.init_cache(batch, max_len, dtype, num_layers=1)

    # ================================================================== attention
    def _attention(self, scope, p, x, rope, positions, layer_cache, absorbed):
        """MLA of ``x [B, T, h]`` at ``positions [T]``. ``layer_cache`` None: attend over the T keys themselves
        (forward / prefill). Else ``(cache, start)``: write at ``start`` and attend over the whole cache (decode).
        Returns ``(out [B, T, h], kv)``: ``kv = {"latent", "k_rope"}`` of the T tokens without a cache, the updated
        cache arrays with one."""
        a = self.arch
        B, T, _ = x.shape
        H, dn, dr, dv, r = (a.num_attention_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim,
                            a.kv_lora_rank)
        cos, sin = rope
        # ---- queries (model.py: q = wq_b(q_norm(wq_a(x))); q_pe = apply_rotary_emb(q_pe, freqs_cis))
        if a.q_lora_rank:
            with jax.named_scope(_in(scope, "q_a_proj")):
                c_q = rms_norm(_linear(x, p["q_a_proj"]), p["q_a_layernorm"], a.norm_eps)
        else:
            c_q = x
        with jax.named_scope(_in(scope, "q_b_proj")):
            q = _linear(c_q, p["q_b_proj"]).reshape(B, T, H, dn + dr)
            q_nope, q_pe = q[..., :dn], apply_rope(q[..., dn:], cos, sin, interleaved=True)
        # ---- the latent and the shared rope key (kv = wkv_a(x); kv_norm(kv); k_pe = apply_rotary_emb(k_pe))
        with jax.named_scope(_in(scope, "kv_a_proj")):
            kv = _linear(x, p["kv_a_proj"])
            latent = rms_norm(kv[..., :r], p["kv_a_layernorm"], a.norm_eps)  # [B, T, r]
            k_rope = apply_rope(kv[..., None, r:], cos, sin, interleaved=True)[:, :, 0]  # [B, T, dr]
        if layer_cache is None:
            kv_out = {"latent": latent, "k_rope": k_rope}
            keys_latent, keys_rope, k_positions, k_valid = latent, k_rope, positions, None
        else:
            cache, start = layer_cache
            with jax.named_scope(_in(scope, "attention")):  # the cache append belongs to the attention kernel
                kv_out = _write(cache, latent, k_rope, start)
            keys_latent, keys_rope = kv_out["latent"].astype(x.dtype), kv_out["k_rope"].astype(x.dtype)
            L = keys_latent.shape[1]
            k_positions = jnp.arange(L, dtype=jnp.int32)
            k_valid = k_positions < start + T
        S = keys_latent.shape[1]
        w_kv_b = p["kv_b_proj"].reshape(r, H, dn + dv)  # wkv_b.view(n_heads, -1, kv_lora_rank), transposed
        if not absorbed:
            # model.py attn_impl="naive": per-head K and V from the latent, q = [q_nope, q_pe], k = [k_nope, k_pe].
            with jax.named_scope(_in(scope, "kv_b_proj")):
                kv_heads = _linear(keys_latent, p["kv_b_proj"]).reshape(B, S, H, dn + dv)
                k_nope, v = kv_heads[..., :dn], kv_heads[..., dn:]
                k = jnp.concatenate([k_nope, jnp.broadcast_to(keys_rope[:, :, None], (B, S, H, dr))], axis=-1)
            with jax.named_scope(_in(scope, "attention")):
                o = attention(jnp.concatenate([q_nope, q_pe], axis=-1), k, v, q_positions=positions,
                              k_positions=k_positions, k_valid=k_valid, scale=self.softmax_scale)  # [B, T, H, dv]
        else:
            # model.py attn_impl="absorb": q_nope = einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :dn]); scores over
            # the cached latent plus the rope key; o = einsum("bshc,hdc->bshd", o_lat, wkv_b[:, -dv:]).
            with jax.named_scope(_in(scope, "kv_b_proj")):
                q_lat = jnp.einsum("bthd,rhd->bthr", q_nope, w_kv_b[..., :dn],
                                   preferred_element_type=jnp.float32).astype(x.dtype)
            with jax.named_scope(_in(scope, "attention")):
                # MQA: one 576-wide key (latent ++ rope key) and one 512-wide value (the latent) for all heads.
                k = jnp.concatenate([keys_latent, keys_rope], axis=-1)[:, :, None]  # [B, S, 1, r + dr]
                o_lat = attention(jnp.concatenate([q_lat, q_pe], axis=-1), k, keys_latent[:, :, None],
                                  q_positions=positions, k_positions=k_positions, k_valid=k_valid,
                                  scale=self.softmax_scale)  # [B, T, H, r]
            with jax.named_scope(_in(scope, "kv_b_proj")):
                o = jnp.einsum("bthr,rhd->bthd", o_lat, w_kv_b[..., dn:],
                               preferred_element_type=jnp.float32).astype(x.dtype)
        with jax.named_scope(_in(scope, "o_proj")):
            out = _linear(o.reshape(B, T, H * dv), p["o_proj"])
        return out, kv_out

    # ================================================================== FFNs
    def _ffn(self, scope, p, x):
        a = self.arch
        B, T, h = x.shape
        if "mlp" in p:
            with jax.named_scope(_in(scope, "mlp")):
                return swiglu_ffn(x, p["mlp"]["gate"], p["mlp"]["up"], p["mlp"]["down"])
        x2 = x.reshape(B * T, h)
        with jax.named_scope(_in(scope, "router")):
            # transformers DeepseekV3TopkRouter: the router linear in float32; model.py Gate for the selection.
            logits = jnp.dot(x2.astype(jnp.float32), p["router"]["weight"].astype(jnp.float32))
            weights, indices = route(logits, router="sigmoid_grouped", top_k=a.experts_per_token,
                                     n_group=a.n_group, topk_group=a.topk_group,
                                     routed_scaling_factor=a.routed_scaling_factor,
                                     correction_bias=p["router"].get("correction_bias"),
                                     normalize_topk=a.router_normalize_topk)
        with jax.named_scope(_in(scope, "experts")):
            e = p["experts"]
            y = grouped_expert_ffn(x2, weights, indices, e["gate"], e["up"], e["down"])
        if "shared" in p:  # model.py MoE.forward: (y + shared_experts(x))
            with jax.named_scope(_in(scope, "shared_expert")):
                s = p["shared"]
                y = y + swiglu_ffn(x2, s["gate"], s["up"], s["down"])
        return y.reshape(B, T, h)

    def _layer(self, scope, p, x, rope, positions, layer_cache, absorbed):
        with jax.named_scope(scope):
            return self._block_jit(absorbed, p, x, rope, positions, layer_cache)

    def _block(self, absorbed, p, x, rope, positions, layer_cache):
        """model.py Block: x = x + attn(attn_norm(x)); x = x + ffn(ffn_norm(x)) (inside its layer's scope, so the
        residual adds and index arithmetic belong to the layer, as in the GQA model)."""
        eps = self.arch.norm_eps
        with jax.named_scope("attn_norm"):
            hn = rms_norm(x, p["attn_norm"], eps)
        a, kv = self._attention("", p["attn"], hn, rope, positions, layer_cache, absorbed)
        x = x + a
        with jax.named_scope("ffn_norm"):
            hn = rms_norm(x, p["ffn_norm"], eps)
        return x + self._ffn("", p, hn), kv

    # ================================================================== trunk
    def _rope(self, positions):
        cos, sin, _ = rope_frequencies(self.arch, self.arch.qk_rope_head_dim, positions)
        return cos, sin

    def embed(self, params, tokens):
        """Token embeddings ``[B, T, h]`` (model.py ParallelEmbedding)."""
        with jax.named_scope("embed"):
            return params["embed"][tokens]

    def _head(self, params, x, norm, scope="", last_only=False):
        """(logits, normed hidden states of every position); ``last_only``: logits of the last position only."""
        with jax.named_scope(f"{scope}final_norm"):
            hidden = rms_norm(x, norm, self.arch.norm_eps)
        with jax.named_scope(f"{scope}lm_head"):
            w = params["embed"].T if self.arch.tie_word_embeddings else params["lm_head"]
            logits = jnp.dot(hidden[:, -1:] if last_only else hidden, w, preferred_element_type=jnp.float32)
        return logits, hidden

    def _trunk(self, params, x, positions, cache, start, absorbed):
        """All layers. ``cache`` None: no cache (forward). ``start`` None: prefill (attend over the fresh keys,
        then write them at 0). Else decode at ``start``. Returns ``(x, new cache layers)``."""
        rope = self._rope(positions)
        new_layers = []
        for i, p in enumerate(params["layers"]):
            layer_cache = None if cache is None or start is None else (cache["layers"][i], start)
            x, kv = self._layer(f"layer_{i}", p, x, rope, positions, layer_cache, absorbed)
            if cache is not None and start is None:  # prefill: the T fresh entries, written at 0
                with jax.named_scope(f"layer_{i}/attention"):
                    kv = _write(cache["layers"][i], kv["latent"], kv["k_rope"], 0)
            if cache is not None:  # (decode: kv already is the updated cache)
                new_layers.append(kv)
        return x, new_layers

    def _inputs(self, params, tokens, input_embeds):
        return self.embed(params, tokens) if input_embeds is None else input_embeds

    def forward(self, params, tokens, *, input_embeds=None, absorbed=False, return_hidden=False):
        """Full causal pass: ``logits [B, T, V]`` (float32), and with ``return_hidden`` also the final hidden
        states ``[B, T, h]`` (after the final norm: the lm_head's input, which is what :meth:`mtp_draft` takes).
        ``input_embeds [B, T, h]`` replaces the token embedding (see :meth:`splice_embeds`)."""
        x = self._inputs(params, tokens, input_embeds)
        positions = jnp.arange(x.shape[1], dtype=jnp.int32)
        x, _ = self._trunk(params, x, positions, None, None, absorbed)
        logits, hidden = self._head(params, x, params["final_norm"])
        return (logits, hidden) if return_hidden else logits

    def prefill(self, params, tokens, cache, *, input_embeds=None, absorbed=False, return_hidden=False,
                all_logits=False):
        """Run positions ``[0, T)`` (attention over the T fresh keys), write them into the cache, set its length
        to T. Returns ``(logits, cache)`` or ``(logits, cache, hidden)``: logits ``[B, 1, V]`` of the last position
        (all a serving engine computes for a prompt: vLLM's ``logits_indices``, TRT-LLM without
        ``gather_context_logits``, SGLang without prompt logprobs), or ``[B, T, V]`` of every position with
        ``all_logits``; ``hidden`` covers every position (the MTP draft layer consumes all of them)."""
        x = self._inputs(params, tokens, input_embeds)
        T = x.shape[1]
        positions = jnp.arange(T, dtype=jnp.int32)
        x, layers = self._trunk(params, x, positions, cache, None, absorbed)
        logits, hidden = self._head(params, x, params["final_norm"], last_only=not all_logits)
        cache = {"layers": layers, "length": jnp.asarray(T, jnp.int32)}
        return (logits, cache, hidden) if return_hidden else (logits, cache)

    def decode(self, params, tokens, cache, *, input_embeds=None, absorbed=True, return_hidden=False):
        """Append ``tokens [B, T]`` (T = 1 for decode; more for speculative verification) at the cache length,
        attending over the cache. Returns ``(logits [B, T, V], cache)`` or ``(logits, cache, hidden)``."""
        x = self._inputs(params, tokens, input_embeds)
        T = x.shape[1]
        start = cache["length"]
        positions = start + jnp.arange(T, dtype=jnp.int32)
        x, layers = self._trunk(params, x, positions, cache, start, absorbed)
        logits, hidden = self._head(params, x, params["final_norm"])
        cache = {"layers": layers, "length": start + T}
        return (logits, cache, hidden) if return_hidden else (logits, cache)

    # ================================================================== MTP draft head
    def mtp_draft(self, params, hidden, next_tokens, *, cache=None, start=0, absorbed=None):
        """DeepSeek-V3 multi-token prediction (tech report eq. 21-23): for position i, from the main model's
        hidden state ``h_i`` and the embedding of token ``t_{i+1}``, the logits of token ``t_{i+2}``::

            h' = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])     # concat order as vLLM deepseek_mtp.py
            h' = DecoderLayer(h');  logits = lm_head(shared_head.norm(h'))  (lm_head and embed shared)

        ``hidden [B, T, h]`` are the main model's final hidden states as :meth:`forward` returns them with
        ``return_hidden`` (vLLM feeds the target model's output, which is after its final norm), ``next_tokens
        [B, T]`` the tokens one position later. Without ``cache``: a causal pass over positions ``start + [0, T)``,
        returns logits ``[B, T, V]``. With ``cache`` (:meth:`init_mtp_cache`): appends at the cache's length and
        returns ``(logits, cache)``, the incremental draft loop of speculative decoding. ``absorbed`` defaults to
        the cache form (absorbed with a cache, un-absorbed without).
        """
        if "mtp" not in params:
            raise ValueError(f"{self.arch.name} has no MTP layer (num_mtp_layers = 0)")
        p = params["mtp"]
        eps = self.arch.norm_eps
        absorbed = (cache is not None) if absorbed is None else absorbed
        with jax.named_scope("mtp/embed"):
            e = params["embed"][next_tokens]
        with jax.named_scope("mtp/enorm"):
            e = rms_norm(e, p["enorm"], eps)
        with jax.named_scope("mtp/hnorm"):
            hn = rms_norm(hidden.astype(e.dtype), p["hnorm"], eps)
        with jax.named_scope("mtp/eh_proj"):
            x = _linear(jnp.concatenate([e, hn], axis=-1), p["eh_proj"])
        T = x.shape[1]
        if cache is None:
            positions = start + jnp.arange(T, dtype=jnp.int32)
            x, _ = self._layer("mtp/layer_0", p["layer"], x, self._rope(positions), positions, None, absorbed)
            return self._head(params, x, p["final_norm"], scope="mtp/")[0]
        begin = cache["length"]
        positions = begin + jnp.arange(T, dtype=jnp.int32)
        x, new = self._layer("mtp/layer_0", p["layer"], x, self._rope(positions), positions,
                             (cache["layers"][0], begin), absorbed)
        logits = self._head(params, x, p["final_norm"], scope="mtp/")[0]
        return logits, {"layers": [new], "length": begin + T}

    # ================================================================== vision (Kimi K2.5)
    def encode_images(self, params, pixels):
        """``pixels [N, H, W, C]`` -> image token embeddings ``[N, tokens, hidden]`` in the text model's width
        (see :mod:`serving.models.vision`)."""
        if self.vision is None:
            raise ValueError(f"{self.arch.name} has no vision tower")
        return self.vision.encode(params["vision"], pixels)

    @staticmethod
    def splice_embeds(token_embeds, image_embeds, image_mask):
        """Token embeddings ``[B, T, h]`` with the positions where ``image_mask [B, T]`` is true replaced, in
        order, by the rows of ``image_embeds [B, M, h]`` (the image placeholder tokens of Kimi's chat template;
        KimiVL ``_merge_with_image_features``). Pass the result as ``input_embeds`` to forward / prefill."""
        idx = jnp.clip(jnp.cumsum(image_mask.astype(jnp.int32), axis=1) - 1, 0, image_embeds.shape[1] - 1)
        picked = jnp.take_along_axis(image_embeds.astype(token_embeds.dtype), idx[..., None], axis=1)
        return jnp.where(image_mask[..., None], picked, token_embeds)
