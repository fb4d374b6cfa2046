"""The reduced model ``python -m codesign.execute`` runs: a published architecture cut to a few layers
(:func:`reduce_arch`), with its routed experts capped when even that would not fit the device's free memory
(:func:`fit_device`). The footprint is computed with ``jax.eval_shape`` (nothing is allocated to find out)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from arch_space.errors import ConfigError

MEMORY_HEADROOM = 0.75  # share of the device's free memory the reduced model may plan to use


def reduce_arch(arch, layers: int, vocab: int | None = None, experts: int | None = None):
    """``arch`` cut to its first ``layers`` decoder layers (vocabulary / routed experts capped when given), without
    the MTP head and vision tower (the measured steps do not run them). Returns (architecture, notes)."""
    notes = []
    changes: dict = {"num_layers": layers}
    if arch.num_mtp_layers:
        changes["num_mtp_layers"] = 0
        notes.append("MTP head left out (decode and prefill steps do not run it)")
    if arch.vision is not None:
        changes["vision"] = None
        notes.append("vision tower left out (text steps only)")
    if vocab is not None:
        changes["vocab_size"] = vocab
    if experts is not None:
        changes["num_experts"] = experts
    if arch.num_experts:
        first = arch.first_k_dense_layers
        if not any(i >= first and (i + 1) % arch.moe_layer_step == 0 for i in range(layers)):
            moe_at = [i for i in range(layers) if (i + 1) % arch.moe_layer_step == 0]
            if not moe_at:
                raise ConfigError("layers", f"{arch.name} has an MoE layer every {arch.moe_layer_step} layers: "
                                            f"{layers} layers hold none, use at least {arch.moe_layer_step}")
            changes["first_k_dense_layers"] = moe_at[-1]
            notes.append(f"first_k_dense_layers {first} -> {moe_at[-1]} so that the {layers} layers include an "
                         f"MoE layer")
    try:
        return dataclasses.replace(arch, **changes), notes
    except ConfigError as err:
        key = {"num_experts": "experts", "experts_per_token": "experts", "vocab_size": "vocab"}.get(err.path)
        raise ConfigError(key or f"workload.{err.path}", err.detail) from None


def _tree_bytes(tree) -> float:
    import jax

    return float(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _footprint(arch, dtype, batches, context, prefill) -> tuple[float, float]:
    """(parameter bytes, peak bytes of the largest step) of ``arch`` executed in ``dtype``."""
    import jax

    from serving.models import build_model

    model = build_model(arch)
    p = _tree_bytes(jax.eval_shape(functools.partial(model.init, dtype=dtype), jax.random.key(0)))
    kv = max(_tree_bytes(jax.eval_shape(functools.partial(model.init_cache, max(batches), context + 1, dtype))),
             _tree_bytes(jax.eval_shape(functools.partial(model.init_cache, 1, prefill, dtype))))
    width = max(arch.hidden_size, arch.intermediate_size or 0,
                (arch.expert_intermediate_size or 0) * max(arch.experts_per_token, 1))
    # float32 logits: one row per decoding sequence, one per prompt (prefill samples from its last position)
    act = 4.0 * (max(batches) * arch.vocab_size + 2 * arch.num_attention_heads * prefill ** 2
                 + 8 * prefill * width)
    return p, p + 3 * kv + act  # the cache: the step's, the segment timing's copy, its output


def fit_device(plan, dtype, free_bytes: float):
    """The architecture to execute: ``plan.arch``, with its routed experts capped when the parameters would not
    fit ``MEMORY_HEADROOM`` x the free device memory. Returns (arch, notes)."""
    arch = plan.arch
    budget = MEMORY_HEADROOM * free_bytes
    p, need = _footprint(arch, dtype, plan.batches, plan.context, plan.prefill_tokens)
    if need <= budget or free_bytes <= 0:
        return arch, []
    gib = 2.0 ** 30
    if arch.num_experts and not plan.experts_set:
        k = arch.experts_per_token
        group = arch.n_group if arch.router == "sigmoid_grouped" and arch.n_group else 1
        # the fewest experts that still route like the model: DeepSeek's grouped router takes the k experts from
        # topk_group of the n_group groups, so each group needs ceil(k / topk_group) of them (8 experts in 8
        # groups would leave a token 4 to choose from); an ungrouped router needs k
        low = group * -(-k // arch.topk_group) if group > 1 else k
        try:
            small = dataclasses.replace(arch, num_experts=low)
        except ConfigError as err:
            raise ConfigError("experts", f"cannot cap {arch.name}'s experts to fit: {err}") from None
        p_low, need_low = _footprint(small, dtype, plan.batches, plan.context, plan.prefill_tokens)
        per_expert = (p - p_low) / (arch.num_experts - low) if arch.num_experts > low else 0.0
        if need_low <= budget and per_expert > 0:
            e = int(low + (budget - need_low) // per_expert)
            e = max(low, min(arch.num_experts - 1, e // group * group))
            try:
                capped = dataclasses.replace(arch, num_experts=e)
            except ConfigError as err:
                raise ConfigError("experts", f"cannot cap {arch.name}'s experts to fit: {err}") from None
            return capped, [f"routed experts capped {arch.num_experts} -> {e} per MoE layer to fit "
                            f"{MEMORY_HEADROOM:.0%} of the device's {free_bytes / gib:.1f} GiB free memory "
                            f"(prediction and measurement both use {e})"]
    if p > budget / 2:  # the weights are the problem
        raise ConfigError("layers", f"{arch.name} at {arch.num_layers} layers needs ~{need / gib:.1f} GiB "
                                    f"({p / gib:.1f} GiB of weights), the device has {free_bytes / gib:.1f} GiB "
                                    f"free: lower layers=, vocab= or experts=")
    raise ConfigError("batch", f"{arch.name} at batch {list(plan.batches)}, context {plan.context} and "
                               f"prefill_tokens {plan.prefill_tokens} needs ~{need / gib:.1f} GiB (of which "
                               f"{p / gib:.1f} GiB weights), the device has {free_bytes / gib:.1f} GiB free: lower "
                               f"batch=, context= or prefill_tokens=")
