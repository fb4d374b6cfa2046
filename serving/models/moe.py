"""Mixture-of-experts pieces: the routers of ``architecture.ROUTERS``, grouped expert FFNs, the dense SwiGLU FFN.

The routed experts run *grouped*: the ``T x k`` (token, expert) assignments are sorted by expert and multiplied
with ``jax.lax.ragged_dot`` against the stacked expert weights, one contiguous group of rows per expert (what
MegaBlocks / vLLM fused-MoE kernels do). Nothing of size ``[T, E, h]`` is ever built, so a full-size trace has
the FLOPs and bytes of the ``k`` chosen experts only.

References (transformers): ``modeling_qwen3_moe.py`` (Qwen3MoeSparseMoeBlock), ``modeling_gpt_oss.py``
(GptOssTopKRouter, GptOssExperts), ``modeling_llama4.py`` (Llama4Router, Llama4TextMoe),
``modeling_deepseek_v3.py`` (DeepseekV3TopkRouter / DeepseekV3MoE.route_tokens_to_experts) and DeepSeek-V3
``inference/model.py`` (Gate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


# ====================================================================== routers
def route(logits, *, router: str, top_k: int, n_group=None, topk_group=None, routed_scaling_factor=1.0,
          correction_bias=None, normalize_topk=False):
    """Routing of ``logits [T, E]`` (float32; the router linear's output, bias included) to
    ``(weights [T, k] float32, indices [T, k] int32)``.

    - ``softmax_topk`` (Qwen3 MoE): ``p = softmax(logits)`` over all E, top-k of p; with ``normalize_topk`` the k
      weights are divided by their sum (``norm_topk_prob``).
    - ``topk_softmax`` (gpt-oss GptOssTopKRouter): top-k of the logits, softmax over the k.
    - ``topk_sigmoid`` (Llama 4 Llama4Router): top-k of the logits, ``sigmoid`` of the chosen logits. (Llama 4
      multiplies these into the expert *input*: see ``grouped_expert_ffn(scale_input=True)``.)
    - ``sigmoid_grouped`` (DeepSeek-V3 ``noaux_tc``): ``s = sigmoid(logits)``; selection on ``s + correction_bias``:
      group score = sum of the top-2 biased scores of each of ``n_group`` groups, the ``topk_group`` best groups
      kept, top-k over the kept experts; weights are the *unbiased* ``s`` of the chosen, divided by their sum when
      ``normalize_topk`` (transformers adds 1e-20 to the sum), times ``routed_scaling_factor``. ``n_group`` None or
      1: no group limit (Kimi K2). Experts outside the kept groups are masked with -inf (DeepSeek's Gate;
      transformers masks with 0.0, which only differs when all kept biased scores are negative).

    ``routed_scaling_factor`` multiplies the weights of every router (1.0 except for DeepSeek / Kimi).
    """
    logits = logits.astype(jnp.float32)
    if router == "softmax_topk":
        probs = jax.nn.softmax(logits, axis=-1)
        weights, indices = jax.lax.top_k(probs, top_k)
        if normalize_topk:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    elif router == "topk_softmax":
        top, indices = jax.lax.top_k(logits, top_k)
        weights = jax.nn.softmax(top, axis=-1)
    elif router == "topk_sigmoid":
        top, indices = jax.lax.top_k(logits, top_k)
        weights = jax.nn.sigmoid(top)
    elif router == "sigmoid_grouped":
        scores = jax.nn.sigmoid(logits)
        choice = scores if correction_bias is None else scores + correction_bias.astype(jnp.float32)
        if n_group is not None and n_group > 1:
            t, e = choice.shape
            grouped = choice.reshape(t, n_group, e // n_group)
            group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [T, n_group]
            _, group_idx = jax.lax.top_k(group_scores, topk_group)
            keep = jnp.any(group_idx[:, :, None] == jnp.arange(n_group)[None, None, :], axis=1)  # [T, n_group]
            keep = jnp.repeat(keep, e // n_group, axis=1)
            choice = jnp.where(keep, choice, -jnp.inf)
        _, indices = jax.lax.top_k(choice, top_k)
        weights = jnp.take_along_axis(scores, indices, axis=-1)
        if normalize_topk:
            weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    else:
        raise ValueError(f"unknown router {router!r}")
    return weights * routed_scaling_factor, indices.astype(jnp.int32)


# ====================================================================== activations and FFNs
def expert_activation(gate, up, activation="swiglu", swiglu_limit=None, alpha=1.702):
    """The gated activation, in float32.

    ``swiglu``: ``silu(gate) * up`` (LlamaMLP). ``swiglu_clamped`` (gpt-oss GptOssExperts): ``gate`` clamped
    above at ``limit``, ``up`` clamped to ``[-limit, limit]``, ``glu = gate * sigmoid(alpha * gate)``,
    out ``(up + 1) * glu``.
    """
    gate, up = gate.astype(jnp.float32), up.astype(jnp.float32)
    if activation == "swiglu":
        return jax.nn.silu(gate) * up
    if activation == "swiglu_clamped":
        gate = jnp.minimum(gate, swiglu_limit)
        up = jnp.clip(up, -swiglu_limit, swiglu_limit)
        return (up + 1.0) * (gate * jax.nn.sigmoid(alpha * gate))
    raise ValueError(f"unknown activation {activation!r}")


def swiglu_ffn(x, w_gate, w_up, w_down):
    """Dense SwiGLU FFN ``(silu(x W_gate) * x W_up) W_down`` (LlamaMLP; shared experts), ``x [..., h]``."""
    gate = jnp.dot(x, w_gate, preferred_element_type=jnp.float32)
    up = jnp.dot(x, w_up, preferred_element_type=jnp.float32)
    act = expert_activation(gate, up).astype(x.dtype)
    return jnp.dot(act, w_down, preferred_element_type=jnp.float32).astype(x.dtype)


def grouped_expert_ffn(x, weights, indices, w_gate, w_up, w_down, *, b_gate=None, b_up=None, b_down=None,
                       activation="swiglu", swiglu_limit=None, alpha=1.702, scale_input=False):
    """Routed experts: ``out[t] = sum_j weights[t, j] * FFN_{indices[t, j]}(x[t])``, ``x [T, h]`` -> ``[T, h]``.

    Weights: ``w_gate, w_up [E, h, f]``, ``w_down [E, f, h]``, optional biases ``b_gate, b_up [E, f]``,
    ``b_down [E, h]``. (gpt-oss stores gate and up interleaved in one ``gate_up_proj [E, h, 2f]``, gate in the
    even columns, up in the odd ones: here they are the two separate arrays ``gate_up[..., ::2]`` and
    ``gate_up[..., 1::2]``; same parameters and FLOPs.)

    The ``T*k`` assignments are sorted by expert (stable argsort of the flattened indices), the token rows
    gathered in that order, and each projection is one ``jax.lax.ragged_dot`` with group sizes
    ``bincount(indices, length=E)``; results are scattered back to (token, slot) order and combined with the
    weights in float32. ``scale_input`` (Llama 4 Llama4TextMoe: ``routed_in = hidden * router_scores``) multiplies
    each row by its weight *before* the expert instead of after.
    """
    t, h = x.shape
    k = indices.shape[1]
    n_experts = w_gate.shape[0]
    flat = indices.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # [T*k]: assignment slots grouped by expert
    sorted_experts = flat[order]
    group_sizes = jnp.bincount(flat, length=n_experts).astype(jnp.int32)
    rows = x[order // k]  # [T*k, h]
    flat_w = weights.reshape(-1).astype(jnp.float32)
    if scale_input:
        rows = (rows.astype(jnp.float32) * flat_w[order][:, None]).astype(x.dtype)

    def project(lhs, w, b):
        y = jax.lax.ragged_dot(lhs, w, group_sizes, preferred_element_type=jnp.float32)
        return y if b is None else y + b.astype(jnp.float32)[sorted_experts]

    gate = project(rows, w_gate, b_gate)
    up = project(rows, w_up, b_up)
    act = expert_activation(gate, up, activation, swiglu_limit, alpha).astype(x.dtype)
    out_sorted = project(act, w_down, b_down)  # [T*k, h] float32
    out = jnp.zeros_like(out_sorted).at[order].set(out_sorted).reshape(t, k, h)
    if scale_input:
        return jnp.sum(out, axis=1).astype(x.dtype)
    return jnp.einsum("tkh,tk->th", out, weights.astype(jnp.float32)).astype(x.dtype)
