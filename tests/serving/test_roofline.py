"""The plain roofline against closed-form cases and physical properties.

Oracles are written here from the published architecture numbers (not from the code under test): Llama 3 8B's
parameter count by the transformer formula, the bandwidth-bound decode time = bytes / bandwidth, and the critical
batch = FLOP rate x bytes per weight / (2 x bandwidth) where decode turns compute bound.
"""

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arch_space.chip import Chip, stack
from serving.architecture import ModelArchitecture
from serving.precision import Precision
from serving.profile import build_profile
from serving.roofline import ServingParams, decode_step_time, evaluate_batch, expected_experts_touched
from serving.scenario import Scenario
from conftest import load_yaml

IDEAL = ServingParams(compute_efficiency=1.0, memory_efficiency=1.0, link_efficiency=1.0, step_overhead_s=0.0,
                      hbm_reserve_fraction=0.1)

# Llama 3 8B (models.md): 32 layers, hidden 4096, 32 q / 8 kv heads of 128, FFN 14336, vocab 128256, untied.
V, H, L, QD, KVD, F = 128256, 4096, 32, 4096, 1024, 14336
LLAMA3_8B_PARAMS = V * H * 2 + L * (H * (QD + 2 * KVD) + QD * H + 3 * H * F + 2 * H) + H


def chip(**kw) -> Chip:
    base = dict(bf16_flops_per_s=989e12, fp8_flops_per_s=1979e12, int8_flops_per_s=0.0, fp4_flops_per_s=0.0,
                sram_capacity_bytes=1.0, sram_bandwidth_bytes_per_s=1e13, hbm_capacity_bytes=80e9,
                hbm_bandwidth_bytes_per_s=3.35e12, scaleup_bandwidth_bytes_per_s=450e9, scaleup_latency_s=1e-6,
                scaleup_domain_chips=8.0, scaleout_bandwidth_bytes_per_s=50e9, power_rating_w=700.0,
                idle_power_w=140.0, allin_power_w=1730.0, die_area_m2=814e-6, rental_usd_per_s=1.3 / 3600)
    base.update(kw)
    return Chip(**base, name="test")


def profile(workload="llama3_8b", precision="bf16", isl=1024, osl=2):
    arch = ModelArchitecture.from_dict(load_yaml(f"workload/{workload}.yaml"))
    sc = Scenario(name="t", kind="closed_loop", isl_tokens=isl, osl_tokens=osl, input_dist="fixed", concurrency=(1,))
    return build_profile(arch, Precision.from_dict(load_yaml(f"precision/{precision}.yaml")), sc)


def test_llama3_8b_parameter_count_matches_formula():
    arch = ModelArchitecture.from_dict(load_yaml("workload/llama3_8b.yaml"))
    assert arch.total_params == LLAMA3_8B_PARAMS


def test_batch1_decode_is_weight_bandwidth_bound():
    w = profile(isl=1024, osl=2)
    c = chip()
    ctx = 1024 + 1  # mean decode context = isl + osl / 2
    kv_bytes = 2 * KVD * L * 2 * ctx  # K and V, bf16
    weight_bytes = (LLAMA3_8B_PARAMS - V * H) * 2  # the input embedding is a gather, not a read
    t, t_c, t_m, t_comm = decode_step_time(c, w, IDEAL, 1.0, 1.0)
    assert float(t_m) == pytest.approx((weight_bytes + kv_bytes) / 3.35e12, rel=1e-5)
    assert float(t) == pytest.approx(float(t_m), rel=1e-6)
    assert float(t_comm) == 0.0
    with_overhead = dataclasses.replace(IDEAL, step_overhead_s=1e-4)
    assert float(decode_step_time(c, w, with_overhead, 1.0, 1.0)[0]) == pytest.approx(float(t) + 1e-4, rel=1e-6)


def test_critical_batch_where_decode_turns_compute_bound():
    w = profile(isl=1, osl=1)  # negligible KV and attention: the pure weight-streaming regime
    c = chip()
    batches = np.arange(1, 1200, dtype=np.float64)
    t_c = np.asarray([float(decode_step_time(c, w, IDEAL, b, 1.0)[1]) for b in batches[::7]])
    t_m = np.asarray([float(decode_step_time(c, w, IDEAL, b, 1.0)[2]) for b in batches[::7]])
    crossing = batches[::7][np.argmax(t_c >= t_m)]
    # B* = rate x bytes/weight / (2 FLOPs per weight x bandwidth) = 989e12 x 2 / (2 x 3.35e12) = 295
    expected = 989e12 * 2 / (2 * 3.35e12)
    assert crossing == pytest.approx(expected, rel=0.04)


def test_expected_experts_touched_closed_form():
    assert float(expected_experts_touched(128.0, 4.0, 1.0)) == pytest.approx(4.0)
    assert float(expected_experts_touched(128.0, 4.0, 1e6)) == pytest.approx(128.0)
    # B = 2: 128 (1 - (124/128)^2)
    assert float(expected_experts_touched(128.0, 4.0, 2.0)) == pytest.approx(128 * (1 - (124 / 128) ** 2))


def test_memory_infeasibility_is_reported_not_a_number():
    w = profile("llama3_70b", "bf16", 1024, 1024)
    out = evaluate_batch(stack([chip()]), w, IDEAL, np.asarray([1.0, 4096.0]), np.asarray([1.0, 4.0, 16.0]))
    code = np.asarray(out["infeasible_code"])[0]
    assert code[0, 0] == 2  # 141 GB of BF16 weights on one 80 GB chip
    assert code[1, 0] == 0 and code[1, 1] == 3  # tp4 fits the weights; 4096 sequences of KV do not
    assert code[2, 0] == 1  # tp16 exceeds the 8-chip domain


def _chips(draw_vals):
    return stack([chip(**draw_vals)])


chip_values = st.fixed_dictionaries({
    "bf16_flops_per_s": st.floats(1e14, 1e16), "fp8_flops_per_s": st.floats(1e14, 2e16),
    "hbm_bandwidth_bytes_per_s": st.floats(1e12, 3e13), "sram_capacity_bytes": st.floats(1e6, 1e9),
    "sram_bandwidth_bytes_per_s": st.floats(1e12, 2e14), "scaleup_bandwidth_bytes_per_s": st.floats(1e11, 4e12),
    "hbm_capacity_bytes": st.floats(1e11, 5e11), "power_rating_w": st.floats(200, 3000)})
SCALED = ("bf16_flops_per_s", "fp8_flops_per_s", "hbm_bandwidth_bytes_per_s", "sram_capacity_bytes",
          "sram_bandwidth_bytes_per_s", "scaleup_bandwidth_bytes_per_s")
W_MOE = profile("gpt_oss_120b", "fp8", 1024, 1024)
CONC = np.asarray([1.0, 8.0, 64.0, 512.0])
TP = np.asarray([1.0, 2.0, 8.0])


@settings(max_examples=40, deadline=None)
@given(vals=chip_values, field=st.sampled_from(SCALED), factor=st.floats(1.0, 4.0))
def test_more_of_any_resource_never_slows_anything(vals, field, factor):
    base = evaluate_batch(_chips(vals), W_MOE, IDEAL, CONC, TP)
    more = evaluate_batch(_chips(vals | {field: vals[field] * factor}), W_MOE, IDEAL, CONC, TP)
    for k in ("tpot_s", "ttft_s", "e2e_s"):
        assert np.all(np.asarray(more[k]) <= np.asarray(base[k]) * (1 + 1e-5)), k
    assert np.all(np.asarray(more["total_tok_s_per_chip"]) >= np.asarray(base["total_tok_s_per_chip"]) * (1 - 1e-5))


@settings(max_examples=25, deadline=None)
@given(vals=chip_values, factor=st.floats(1.1, 3.0))
def test_per_kw_scales_as_one_over_rating_and_is_finite(vals, factor):
    a = evaluate_batch(_chips(vals), W_MOE, IDEAL, CONC, TP)
    b = evaluate_batch(_chips(vals | {"power_rating_w": vals["power_rating_w"] * factor}), W_MOE, IDEAL, CONC, TP)
    np.testing.assert_allclose(np.asarray(a["total_tok_s_per_kw"]) / factor, np.asarray(b["total_tok_s_per_kw"]),
                               rtol=1e-5)
    for k, v in a.items():
        assert np.all(np.isfinite(np.asarray(v))), k


def test_vmapped_batch_equals_per_design_loop():
    vals = [dict(hbm_bandwidth_bytes_per_s=b, fp8_flops_per_s=r) for b, r in [(3e12, 2e15), (8e12, 4.5e15)]]
    batch = evaluate_batch(stack([chip(**v) for v in vals]), W_MOE, IDEAL, CONC, TP)
    for i, v in enumerate(vals):
        single = evaluate_batch(stack([chip(**v)]), W_MOE, IDEAL, CONC, TP)
        np.testing.assert_allclose(np.asarray(batch["tpot_s"])[i], np.asarray(single["tpot_s"])[0], rtol=1e-6)


def test_gradient_wrt_bandwidth_is_finite_and_matches_finite_difference():
    w = profile("llama3_8b", "bf16", 1024, 2)

    def tpot(bw):
        return decode_step_time(chip(hbm_bandwidth_bytes_per_s=bw), w, IDEAL, 1.0, 1.0)[0]

    g = float(jax.grad(tpot)(3.35e12))
    h = 1e9
    fd = (float(tpot(3.35e12 + h)) - float(tpot(3.35e12 - h))) / (2 * h)
    assert np.isfinite(g) and g < 0
    assert g == pytest.approx(fd, rel=0.02)


def test_precision_recipes_per_model_and_block_scale_bytes():
    fp4 = Precision.from_dict(load_yaml("precision/fp4.yaml"))
    oss = fp4.for_workload("gpt_oss_120b")  # native: MXFP4 experts, BF16 attention
    assert oss.routed_experts.weights == "mxfp4" and oss.attention.weights == "bf16"
    assert oss.routed_experts.bytes_per_weight == pytest.approx(4.25 / 8)  # OCP MX: 4 bits + 8-bit scale / 32
    llama = fp4.for_workload("llama3_70b")
    assert llama.dense_ffn.weights == "nvfp4" and llama.dense_ffn.bytes_per_weight == pytest.approx(4.5 / 8)
    int4 = Precision.from_dict(load_yaml("precision/int4.yaml"))
    assert int4.routed_experts.bytes_per_weight == pytest.approx(4.5 / 8) and int4.routed_experts.math == "bf16"
    assert fp4.for_workload("qwen3_30b_a3b") is fp4  # no refinement: the generic recipe


def test_fp4_weights_without_fp4_math_run_at_the_fp8_rate():
    w = profile("llama3_8b", "fp4", 1024, 2)
    h100 = chip(fp4_flops_per_s=0.0)  # Hopper: no FP4 math
    with_fp4 = chip(fp4_flops_per_s=1979e12 * 2)
    t_h = float(decode_step_time(h100, w, IDEAL, 4096.0, 1.0)[1])
    t_f = float(decode_step_time(with_fp4, w, IDEAL, 4096.0, 1.0)[1])
    assert t_f < t_h  # the FP4 layers go twice as fast with native FP4 math
    # on the chip without FP4 the FP4-stored layers run at the FP8 rate, i.e. exactly as an FP8 recipe's would
    w8 = profile("llama3_8b", "fp8", 1024, 2)
    assert t_h == pytest.approx(float(decode_step_time(h100, w8, IDEAL, 4096.0, 1.0)[1]), rel=1e-6)
