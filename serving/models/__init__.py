"""Executable JAX models of the workload families, built from a :class:`~serving.architecture.ModelArchitecture`.

Conventions every family follows (the operator-graph tracer in ``serving/graph.py`` relies on them):

Parameters are a plain pytree (dicts and lists of arrays):
    {"embed": [V, h], "lm_head": [h, V] (absent if tied), "final_norm": [h],
     "layers": [ {"attn_norm": ..., "attn": {...}, "ffn_norm": ..., and one of
                  "mlp": {...}                                     (dense FFN)
                  "router": {...}, "experts": {...}, "shared": {...} (MoE; "shared" only with a shared expert)}, ...],
     "mtp": {...} (DeepSeek's multi-token-prediction layer), "vision": {...} (Kimi K2.5's tower + projector)}
The top-level key (or, inside a layer, the key) names the tensor class: attn -> attention, mlp -> dense_ffn,
experts -> routed_experts, shared -> shared_experts, router -> router, *_norm / final_norm -> norms,
embed -> embedding, lm_head -> lm_head, mtp -> mtp, vision -> vision.

Every kernel runs inside ``jax.named_scope("layer_{i}/<kernel>")`` (or a top-level scope ``embed``,
``final_norm``, ``lm_head``, ``mtp/...``, ``vision/...``) with kernel names:
    attn_norm, qkv_proj (GQA) | q_a_proj, q_b_proj, kv_a_proj, kv_b_proj (MLA), attention, o_proj,
    ffn_norm, mlp, router, experts, shared_expert

A model object exposes:
    init(key, dtype) -> params                     random weights (small configs; use jax.eval_shape at full size)
    init_cache(batch, max_len, dtype) -> cache     contiguous KV cache (MLA caches the 576-wide latent)
    forward(params, tokens[B, T]) -> logits[B, T, V]             full causal pass, no cache
    prefill(params, tokens[B, T], cache) -> (logits[B, 1, V], cache)   fills cache positions [0, T); logits of
                                                   the last position (all_logits=True: [B, T, V])
    decode(params, tokens[B, 1], cache) -> (logits[B, 1, V], cache)   one step at the cache's current length
"""

from __future__ import annotations


def build_model(arch):
    """The executable model of ``arch``'s family."""
    from arch_space.errors import ConfigError

    if arch.family == "gqa":
        from serving.models.gqa import GQATransformer

        return GQATransformer(arch)
    if arch.family == "mla":
        from serving.models.mla import MLATransformer

        return MLATransformer(arch)
    raise ConfigError("workload.family", f"no model code for family {arch.family!r}")
