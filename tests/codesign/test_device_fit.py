"""codesign.device_fit: the reduced model execute runs, and the expert cap that makes it fit the device's memory.

Oracles: the layer rules of the published config (an MoE layer is one at index >= first_k_dense_layers on the
moe_layer_step grid) and the closed-form bytes of one routed expert of DeepSeek-R1 (gate, up and down projections
h x i each, plus its router row and correction bias), not the footprint code under test.
"""

import dataclasses
import types
from pathlib import Path

import jax.numpy as jnp
import pytest
import yaml

from arch_space.errors import ConfigError
from codesign.device_fit import MEMORY_HEADROOM, _footprint, fit_device, reduce_arch
from serving.architecture import ModelArchitecture

ROOT = Path(__file__).resolve().parents[2]


def preset(name: str) -> ModelArchitecture:
    return ModelArchitecture.from_dict(yaml.safe_load((ROOT / "conf" / "workload" / f"{name}.yaml").read_text()),
                                       "workload")


def moe_layers(arch) -> list[int]:
    return [i for i in range(arch.num_layers)
            if i >= arch.first_k_dense_layers and (i + 1) % arch.moe_layer_step == 0]


def plan(arch, experts_set=False):
    return types.SimpleNamespace(arch=arch, batches=(2,), context=64, prefill_tokens=32, experts_set=experts_set)


def test_reduce_arch_keeps_an_moe_layer_and_drops_what_the_steps_do_not_run():
    full = preset("deepseek_r1")  # 3 dense layers first, then MoE; an MTP head
    assert full.first_k_dense_layers == 3 and full.num_mtp_layers == 1
    arch, notes = reduce_arch(full, 2, vocab=1024)
    assert arch.num_layers == 2 and arch.vocab_size == 1024 and arch.num_mtp_layers == 0
    assert moe_layers(arch) == [1]  # two layers, the second MoE: the reduced model still runs the experts
    assert any("first_k_dense_layers 3 -> 1" in n for n in notes) and any("MTP" in n for n in notes)
    same, notes = reduce_arch(preset("llama3_8b"), 1)
    assert same.num_layers == 1 and notes == []


def test_reduce_arch_names_the_knob_of_an_invalid_expert_count():
    with pytest.raises(ConfigError) as err:
        reduce_arch(preset("qwen3_30b_a3b"), 1, experts=4)  # fewer experts than the 8 each token routes to
    assert err.value.path == "experts"


def test_fit_device_leaves_a_model_that_fits_alone():
    arch, _ = reduce_arch(preset("deepseek_r1"), 2, vocab=1024)
    assert fit_device(plan(arch), jnp.float32, free_bytes=1e12) == (arch, [])


def test_fit_device_caps_the_experts_at_the_largest_group_multiple_that_fits():
    arch, _ = reduce_arch(preset("deepseek_r1"), 2, vocab=1024)
    h, i, group = arch.hidden_size, arch.expert_intermediate_size, arch.n_group
    assert (arch.experts_per_token, arch.topk_group, group) == (8, 4, 8)
    low = group * 2  # 8 per token from 4 of 8 groups: at least 2 experts a group
    per_expert = (3 * h * i + h + 1) * 4.0 * len(moe_layers(arch))  # float32 weights, router row, bias
    _, need_full = _footprint(arch, jnp.float32, (2,), 64, 32)
    _, need_low = _footprint(dataclasses.replace(arch, num_experts=low), jnp.float32, (2,), 64, 32)
    assert need_full - need_low == pytest.approx((arch.num_experts - low) * per_expert, rel=1e-9)
    free = need_full / 2 / MEMORY_HEADROOM  # room for about half of the experts
    capped, notes = fit_device(plan(arch), jnp.float32, free)
    budget = MEMORY_HEADROOM * free
    expected = low + int((budget - need_low) // per_expert) // group * group
    assert capped.num_experts == expected and capped.num_experts % group == 0
    assert need_low + (expected - low) * per_expert <= budget < need_low + (expected + group - low) * per_expert
    assert dataclasses.replace(capped, num_experts=arch.num_experts) == arch  # nothing else changed
    assert f"256 -> {expected}" in notes[0]


def test_fit_device_refuses_when_nothing_fits_or_the_user_fixed_the_experts():
    arch, _ = reduce_arch(preset("deepseek_r1"), 2, vocab=1024)
    _, need_low = _footprint(dataclasses.replace(arch, num_experts=2 * arch.n_group), jnp.float32, (2,), 64, 32)
    with pytest.raises(ConfigError) as err:
        fit_device(plan(arch), jnp.float32, need_low / 2)
    assert err.value.path == "layers" and "GiB free" in str(err.value)
    _, need_full = _footprint(arch, jnp.float32, (2,), 64, 32)
    with pytest.raises(ConfigError):  # experts= given: the command never overrides the user's choice
        fit_device(plan(arch, experts_set=True), jnp.float32, need_full / 2 / MEMORY_HEADROOM)


def test_fit_device_blames_the_batch_when_the_weights_fit_but_the_cache_does_not():
    arch, _ = reduce_arch(preset("llama3_8b"), 1, vocab=1024)
    big = types.SimpleNamespace(arch=arch, batches=(4096,), context=8192, prefill_tokens=32, experts_set=False)
    weights, need = _footprint(arch, jnp.float32, (4096,), 8192, 32)
    kv = 4096 * 8193 * 2 * arch.num_kv_heads * arch.head_dim * 4.0  # K and V, float32, one layer
    assert need > 3 * kv > 100 * weights  # the closed-form cache dwarfs the weights (x3: the timing's copies)
    with pytest.raises(ConfigError) as err:
        fit_device(big, jnp.float32, free_bytes=need / 2)
    assert err.value.path == "batch" and "lower batch=, context= or prefill_tokens=" in str(err.value)
