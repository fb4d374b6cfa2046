"""The serving model against closed-form cases and physical properties.

Oracles are written here from published architecture numbers, not from the code under test: Llama 3 8B's
parameter count by the transformer formula, the bandwidth-bound decode time = bytes / bandwidth, the critical batch
where a GEMM turns compute bound, Leviathan et al.'s expected accepted tokens, and token conservation.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from arch_space.errors import ConfigError
from arch_space.chip import Chip, stack
from serving.architecture import ModelArchitecture
from serving.kernel_table import GROUP_EXPERTS, build_kernel_table
from serving.mappings import enumerate_mappings, mapping_name
from serving.memory import max_sequences, memory_code, memory_terms
from serving.perf import Mapping, ServingParams, Work, kernel_times, power_capped, \
    step_time
from serving.precision import MATH_DTYPES, Precision
from serving.scenario import Scenario
from serving.serve import evaluate_grid, evaluate_point, stack_mappings
from conftest import load_yaml

TINY = 1e-9  # "half" points of the efficiency curves: efficiency ~ e_max for any real size
IDEAL = ServingParams(gemm_efficiency_max=1.0, gemm_rows_half=TINY, attention_efficiency_max=1.0,
                      attention_rows_half=TINY, moe_efficiency_max=1.0, moe_rows_half=TINY,
                      memory_efficiency_max=1.0, memory_bytes_half=TINY, link_efficiency=1.0, kernel_overhead_s=0.0,
                      step_overhead_s=0.0, comm_overlap=0.0, hbm_reserve_fraction=0.1)
DEFAULT = ServingParams.from_dict(load_yaml("serving/default.yaml"))

# Llama 3 8B (models.md): 32 layers, hidden 4096, 32 q / 8 kv heads of 128, FFN 14336, vocab 128256, untied.
V, H, L, QD, KVD, F = 128256, 4096, 32, 4096, 1024, 14336
LLAMA3_8B_PARAMS = V * H * 2 + L * (H * (QD + 2 * KVD) + QD * H + 3 * H * F + 2 * H) + H


def chip(**kw) -> Chip:
    base = dict(bf16_flops_per_s=989e12, fp8_flops_per_s=1979e12, int8_flops_per_s=0.0, fp4_flops_per_s=0.0,
                sram_capacity_bytes=1.0, sram_bandwidth_bytes_per_s=1e13, hbm_capacity_bytes=80e9,
                hbm_bandwidth_bytes_per_s=3.35e12, scaleup_bandwidth_bytes_per_s=450e9, scaleup_latency_s=1e-6,
                scaleup_domain_chips=8.0, scaleout_bandwidth_bytes_per_s=50e9, power_rating_w=700.0,
                idle_power_w=140.0, allin_power_w=1730.0, die_area_m2=814e-6, rental_usd_per_s=1.3 / 3600,
                fp8_energy_j_per_flop=1.28e-13, hbm_energy_j_per_byte=3.12e-11, sram_energy_j_per_byte=5e-12,
                link_energy_j_per_byte=4.4e-11, sram_explicit_fraction=0.0)
    base.update(kw)
    return Chip(**base, name="test")


def arch(name):
    return ModelArchitecture.from_dict(load_yaml(f"workload/{name}.yaml"))


def table(workload, precision):
    return build_kernel_table(arch(workload), Precision.from_dict(load_yaml(f"precision/{precision}.yaml")))


def scenario(name="inferencex_1k1k", **kw):
    return dataclasses.replace(Scenario.from_dict(load_yaml(f"scenario/{name}.yaml")), **kw)


def decode_work(b, ctx):
    return Work(decode_tokens=b, decode_queries=1.0, context=ctx, prefill_requests=0.0, prefill_len=1.0)


def test_llama3_8b_parameter_count_matches_formula():
    assert arch("llama3_8b").total_params == LLAMA3_8B_PARAMS


def test_batch1_decode_is_weight_bandwidth_bound():
    kt = table("llama3_8b", "bf16")
    ctx = 1024.0
    weights = (LLAMA3_8B_PARAMS - V * H) * 2  # every weight but the input embedding (a row gather), BF16
    kv = 2 * KVD * L * 2 * ctx  # K and V of every layer, BF16
    t, _ = step_time(chip(), kt, IDEAL, Mapping(), decode_work(1.0, ctx))
    expected = (weights + kv) / 3.35e12
    # the only other bytes are activations crossing kernels: < 50 hidden vectors per layer = 0.03% of the weights
    assert float(t) == pytest.approx(expected, rel=1e-3)
    assert float(t) >= expected
    with_overhead = dataclasses.replace(IDEAL, step_overhead_s=1e-4)
    assert float(step_time(chip(), kt, with_overhead, Mapping(), decode_work(1.0, ctx))[0]) == pytest.approx(
        float(t) + 1e-4, rel=1e-5)


def test_critical_batch_where_the_ffn_gemm_turns_compute_bound():
    kt = table("llama3_8b", "bf16")
    k = kt.names.index("mlp")
    batches = np.arange(8.0, 600.0, 2.0)
    ratio = []
    for b in batches:
        out = kernel_times(chip(), kt, IDEAL, Mapping(), decode_work(b, 1.0))
        ratio.append(float(out["t_compute"][k]) / float(out["t_memory"][k]))
    crossing = batches[int(np.argmax(np.asarray(ratio) >= 1.0))]
    # weights W = 3 h F x 2 bytes; FLOPs 2 x 3 h F per token; activations in + out 2 h x 2 bytes per token:
    # 2 P B / R = (2 P + 4 h B) / bw  ->  B* = 2 P / bw / (2 P / R - 4 h / bw) = 299: the weights-only critical
    # batch R x bytes/weight / (2 bw) = 295, shifted 1.4% by the activations the GEMM also moves
    p = 3 * H * F
    expected = 2 * p / 3.35e12 / (2 * p / 989e12 - 4 * H / 3.35e12)
    assert crossing == pytest.approx(expected, abs=2.0)  # the scan steps by 2


def test_memory_infeasibility_is_reported_with_its_reason():
    kt = table("llama3_70b", "bf16")
    sc = scenario()
    maps = stack_mappings([Mapping(tp=1), Mapping(tp=4), Mapping(tp=16)])
    out = evaluate_grid(stack([chip()]), kt, DEFAULT, sc, maps, np.asarray([1.0, 4096.0], np.float32))
    code = np.asarray(out["infeasible_code"])[0]
    assert code[0, 0] == 2  # 141 GB of BF16 weights on one 80 GB chip
    assert code[1, 0] == 0 and code[1, 1] == 3  # tp4 holds the weights, not the KV of 4096 sequences
    assert code[2, 0] == 1  # 16 chips exceed the 8-chip domain


@pytest.mark.parametrize("tp, ctx", [(1.0, 2048.0), (2.0, 9216.0), (4.0, 33792.0)])
def test_max_sequences_is_the_kv_capacity_in_closed_form(tp, ctx):
    kt = table("llama3_8b", "bf16")
    m = Mapping(tp=tp)
    # (0.9 x 80 GB - BF16 weights / tp) / (K and V of 32 layers x 1024 values x 2 bytes x ctx / tp (8 KV heads))
    expected = (0.9 * 80e9 - LLAMA3_8B_PARAMS * 2 / tp) / (2 * KVD * L * 2 * ctx / tp)
    got = float(max_sequences(chip(), kt, DEFAULT, m, ctx))
    assert got == pytest.approx(expected, rel=1e-4)
    # and it is the memory check's boundary: the largest whole batch fits, one more does not
    n = np.floor(got)
    assert int(memory_code(chip(), kt, DEFAULT, m, n, ctx)[0]) == 0
    assert int(memory_code(chip(), kt, DEFAULT, m, n + 1, ctx)[0]) == 3


def test_tokens_in_equal_tokens_out_in_every_scenario():
    kt = table("gpt_oss_120b", "fp4")
    for sc in (scenario("inferencex_8k1k"), scenario("offline_1k1k"), scenario(kind="disaggregated"),
               scenario(kind="agentic", turns=4, turn_input_tokens=512, tool_gap_s=2.0, prefix_cache_hit_rate=0.9,
                        chain_steps=4),
               scenario(draft_tokens=2, acceptance_rate=0.7)):
        out = evaluate_point(chip(fp4_flops_per_s=0.0), kt, DEFAULT, sc, Mapping(tp=2), 64.0)
        out = {k: float(v) for k, v in out.items()}
        if sc.kind == "agentic":
            continue  # per-turn input differs from isl; checked below
        isl, osl = sc.mean_isl_tokens, sc.mean_osl_tokens
        assert out["total_tok_s_per_chip"] == pytest.approx(out["output_tok_s_per_chip"] * (isl + osl) / osl,
                                                            rel=1e-5), sc.kind


def test_speculative_decoding_follows_the_expected_accepted_tokens():
    sc = scenario(draft_tokens=3, acceptance_rate=0.8)
    assert sc.tokens_per_step == pytest.approx((1 - 0.8 ** 4) / (1 - 0.8))  # Leviathan et al. 2023
    kt = table("deepseek_r1", "fp8")
    c = chip(hbm_capacity_bytes=192e9, scaleup_domain_chips=72.0)
    plain = evaluate_point(c, kt, DEFAULT, scenario(), Mapping(dp=8, ep=8), 1.0)
    spec = evaluate_point(c, kt, DEFAULT, sc, Mapping(dp=8, ep=8), 1.0)
    # at batch 1 decode is memory bound: verifying 4 tokens costs little more than 1, so interactivity rises
    assert float(spec["interactivity_tok_s_user"]) > 1.5 * float(plain["interactivity_tok_s_user"])


@pytest.mark.parametrize("n,a1,a", [(1, 0.85, 0.7), (3, 0.85, 0.7), (4, 0.6, 0.9), (3, 0.8, 0.8)])
def test_a_draft_advances_by_its_accepted_prefix_plus_one(n, a1, a):
    """Oracle: the distribution of the accepted prefix length j (the first draft token accepted with a1, each later
    one given the earlier with a; the target model's verified token is always added): E[j + 1]."""
    p = [1.0 - a1] + [a1 * a ** (j - 1) * (1.0 - a) for j in range(1, n)] + [a1 * a ** (n - 1)]
    assert sum(p) == pytest.approx(1.0)
    expected = sum((j + 1) * pj for j, pj in enumerate(p))
    assert scenario(draft_tokens=n, acceptance_rate=a, first_acceptance_rate=a1).tokens_per_step \
        == pytest.approx(expected, rel=1e-12)


def test_first_draft_acceptance_is_validated_and_defaults_to_the_per_token_rate():
    base = dict(load_yaml("scenario/inferencex_8k1k_mtp.yaml"))
    assert Scenario.from_dict(base | {"first_acceptance_rate": None}).tokens_per_step == pytest.approx(
        (1 - 0.7 ** 4) / (1 - 0.7))
    with pytest.raises(ConfigError, match=r"^scenario.first_acceptance_rate: must be < 1, got 1.0$"):
        Scenario.from_dict(base | {"first_acceptance_rate": 1.0})
    with pytest.raises(ConfigError, match=r"^scenario.first_acceptance_rate: must be > 0 when draft_tokens > 0"):
        Scenario.from_dict(base | {"first_acceptance_rate": 0.0})


def test_disaggregated_pools_balance_request_rates():
    kt = table("llama3_70b", "fp8")
    sc = scenario(kind="disaggregated")
    out = {k: float(v) for k, v in evaluate_point(chip(), kt, DEFAULT, sc, Mapping(tp=4), 128.0).items()}
    rate_p = out["prefill_input_tok_s_per_chip"] / sc.mean_isl_tokens
    rate_d = out["decode_output_tok_s_per_chip"] / sc.mean_osl_tokens
    f = out["prefill_pool_fraction"]
    assert f * rate_p == pytest.approx((1 - f) * rate_d, rel=1e-4)
    fixed = evaluate_point(chip(), kt, DEFAULT, dataclasses.replace(sc, prefill_pool_fraction=0.5), Mapping(tp=4), 128.0)
    assert float(fixed["total_tok_s_per_chip"]) <= out["total_tok_s_per_chip"] * (1 + 1e-6)  # searched is best


def test_agentic_chain_latency_adds_tool_gaps():
    kt = table("llama3_8b", "fp8")
    base = scenario(kind="agentic", turns=4, turn_input_tokens=256, prefix_cache_hit_rate=0.9, chain_steps=5)
    a = evaluate_point(chip(), kt, DEFAULT, base, Mapping(), 8.0)
    b = evaluate_point(chip(), kt, DEFAULT, dataclasses.replace(base, tool_gap_s=1.5), Mapping(), 8.0)
    assert float(b["e2e_s"]) == pytest.approx(float(a["e2e_s"]) + 5 * 1.5, rel=1e-5)
    cold = evaluate_point(chip(), kt, DEFAULT, dataclasses.replace(base, prefix_cache_hit_rate=0.0), Mapping(), 8.0)
    assert float(cold["ttft_s"]) > float(a["ttft_s"])  # prefix-cache hits shorten each turn's prefill


def test_mappings_enumerated_for_dense_and_moe():
    dense = {mapping_name(m) for m in enumerate_mappings(arch("llama3_70b"), 8)}
    assert {"tp1", "tp2", "tp4", "tp8", "tp4pp2"} <= dense and not any("ep" in n for n in dense)
    moe = {mapping_name(m) for m in enumerate_mappings(arch("deepseek_r1"), 8)}
    assert {"tp8", "tp8ep8", "dep8", "tp2dep4"} <= moe


@pytest.mark.parametrize("name, max_chips", [("llama3_70b", 72), ("deepseek_r1", 96), ("qwen3_30b_a3b", 72)])
def test_tensor_parallel_degrees_shard_whole_heads(name, max_chips):
    # Engines shard whole attention heads; 72 or 96 chips must not yield tp36pp2 / tp48pp2 for 64 / 128 heads.
    a = arch(name)
    tps = {int(m.tp) for m in enumerate_mappings(a, max_chips)}
    assert tps and all(a.num_attention_heads % t == 0 for t in tps)
    assert 36 not in tps and 48 not in tps
    assert max(tps) == min(a.num_attention_heads, 64)  # the largest power of two the search reaches


chip_values = st.fixed_dictionaries({
    "bf16_flops_per_s": st.floats(1e14, 1e16), "fp8_flops_per_s": st.floats(1e14, 2e16),
    "hbm_bandwidth_bytes_per_s": st.floats(1e12, 3e13), "sram_capacity_bytes": st.floats(1e6, 1e9),
    "sram_bandwidth_bytes_per_s": st.floats(1e12, 2e14), "scaleup_bandwidth_bytes_per_s": st.floats(1e11, 4e12),
    "hbm_capacity_bytes": st.floats(1e11, 5e11), "power_rating_w": st.floats(300, 3000)})
SCALED = ("bf16_flops_per_s", "fp8_flops_per_s", "hbm_bandwidth_bytes_per_s", "sram_capacity_bytes",
          "sram_bandwidth_bytes_per_s", "scaleup_bandwidth_bytes_per_s", "power_rating_w")
KT_MOE = table("gpt_oss_120b", "fp8")
SC = scenario("inferencex_1k1k")
CONC = np.asarray([1.0, 8.0, 64.0, 512.0], np.float32)
MAPS = stack_mappings([Mapping(), Mapping(tp=2), Mapping(tp=8, ep=8), Mapping(dp=4, ep=4), Mapping(tp=2, pp=2)])


def grid(vals):
    return {k: np.asarray(v) for k, v in evaluate_grid(stack([chip(**vals)]), KT_MOE, DEFAULT, SC, MAPS, CONC).items()}


@settings(max_examples=30, deadline=None)
@given(vals=chip_values, field=st.sampled_from(SCALED), factor=st.floats(1.0, 4.0))
def test_more_of_any_resource_never_slows_anything(vals, field, factor):
    base, more = grid(vals), grid(vals | {field: vals[field] * factor})
    for k in ("tpot_s", "ttft_s", "e2e_s"):
        assert np.all(more[k] <= base[k] * (1 + 1e-5)), k
    assert np.all(more["total_tok_s_per_chip"] >= base["total_tok_s_per_chip"] * (1 - 1e-5))


@settings(max_examples=20, deadline=None)
@given(vals=chip_values, factor=st.floats(1.1, 3.0))
def test_per_kw_scales_as_one_over_rating_when_the_clock_is_not_capped(vals, factor):
    vals = vals | {"power_rating_w": 3000.0}
    a, b = grid(vals), grid(vals | {"power_rating_w": 3000.0 * factor})
    assume(np.all(a["clock_factor"] == 1.0))
    np.testing.assert_allclose(a["total_tok_s_per_kw"] / factor, b["total_tok_s_per_kw"], rtol=1e-5)
    for k, v in a.items():
        if k != "total_tok_s_per_allin_kw":
            assert np.all(np.isfinite(v)), k


def test_power_cap_throttles_the_clock():
    # streaming 30 TB/s at 31 pJ/byte alone would draw ~940 W: a 300 W rating must slow the chip down
    hot = grid({"hbm_bandwidth_bytes_per_s": 3e13, "power_rating_w": 300.0})
    assert np.all(hot["sustained_power_w"] <= 300.0 * (1 + 1e-5))
    assert np.min(hot["clock_factor"]) < 1.0
    cool = grid({"hbm_bandwidth_bytes_per_s": 3e13, "power_rating_w": 3000.0})
    assert np.all(cool["clock_factor"] == 1.0) and np.all(cool["tpot_s"] <= hot["tpot_s"])


def test_vmapped_batch_equals_per_design_loop():
    vals = [dict(hbm_bandwidth_bytes_per_s=b, fp8_flops_per_s=r) for b, r in [(3e12, 2e15), (8e12, 4.5e15)]]
    batch = evaluate_grid(stack([chip(**v) for v in vals]), KT_MOE, DEFAULT, SC, MAPS, CONC)
    for i, v in enumerate(vals):
        np.testing.assert_allclose(np.asarray(batch["tpot_s"])[i], grid(v)["tpot_s"][0], rtol=1e-6)


def test_gradient_wrt_chip_parameters_matches_finite_differences():
    kt = table("llama3_8b", "bf16")

    def tpot(bw, rate):
        c = chip(hbm_bandwidth_bytes_per_s=bw, bf16_flops_per_s=rate)
        return evaluate_point(c, kt, DEFAULT, SC, Mapping(), 32.0)["tpot_s"]

    g_bw, g_rate = jax.grad(tpot, argnums=(0, 1))(3.35e12, 989e12)
    assert np.isfinite(float(g_bw)) and float(g_bw) < 0
    for i, (x0, g) in enumerate(((3.35e12, g_bw), (989e12, g_rate))):
        h = x0 * 1e-3
        args_p = [3.35e12, 989e12]
        args_m = [3.35e12, 989e12]
        args_p[i] += h
        args_m[i] -= h
        fd = (float(tpot(*args_p)) - float(tpot(*args_m))) / (2 * h)
        assert float(g) == pytest.approx(fd, rel=0.05, abs=1e-30)


def test_precision_recipes_per_model_and_block_scale_bytes():
    fp4 = Precision.from_dict(load_yaml("precision/fp4.yaml"))
    oss = fp4.for_workload("gpt_oss_120b")  # native: MXFP4 experts (W4A8: FP8 math), BF16 attention
    assert oss.routed_experts.weights == "mxfp4" and oss.attention.weights == "bf16"
    assert oss.routed_experts.math == "fp8"
    assert oss.routed_experts.bytes_per_weight == pytest.approx(4.25 / 8)  # OCP MX: 4 bits + 8-bit scale / 32
    llama = fp4.for_workload("llama3_70b")
    assert llama.dense_ffn.weights == "nvfp4" and llama.dense_ffn.bytes_per_weight == pytest.approx(4.5 / 8)
    int4 = Precision.from_dict(load_yaml("precision/int4.yaml"))
    assert int4.routed_experts.bytes_per_weight == pytest.approx(4.5 / 8) and int4.routed_experts.math == "bf16"
    assert fp4.for_workload("qwen3_30b_a3b") is fp4  # no refinement: the generic recipe
    # gpt-oss has no FP8 checkpoint: "fp8" (Hopper) runs its shipped MXFP4 experts in BF16 math (W4A16)
    oss8 = Precision.from_dict(load_yaml("precision/fp8.yaml")).for_workload("gpt_oss_20b")
    assert (oss8.routed_experts.weights, oss8.routed_experts.math) == ("mxfp4", "bf16")
    assert oss8.attention.weights == "bf16" and oss8.kv_cache == "fp8"
    # the EP dispatch is quantised (FP8 + an FP32 scale per 128 channels) only where the experts take quantised
    # activations; W4A16 / BF16 experts receive BF16 tokens
    assert fp4.dispatch_bytes == pytest.approx(1 + 4 / 128) and oss.dispatch_bytes == pytest.approx(1 + 4 / 128)
    assert oss8.dispatch_bytes == int4.dispatch_bytes == 2.0
    assert Precision.from_dict(load_yaml("precision/bf16.yaml")).dispatch_bytes == 2.0


def test_gpt_oss_fp4_experts_run_w4a8_at_the_fp8_rate():
    """gpt-oss's FP4 serving recipe is MXFP4 weights x FP8 activations (engines never quantise its activations to
    FP4): every routed-expert FLOP is FP8 math and none is FP4. Closed form of the decode FLOPs per token: 36 layers
    x top-4 experts x (gate+up 2880 -> 2 x 2880, down 2880 -> 2880) x 2 FLOPs per weight (models.md)."""
    kt = table("gpt_oss_120b", "fp4")
    per_token = (kt.d_flops_b * kt.count[:, None]).sum(axis=0)  # by math dtype
    assert per_token[MATH_DTYPES.index("fp4")] == 0.0
    assert per_token[MATH_DTYPES.index("fp8")] == pytest.approx(36 * 4 * 3 * 2880 * 2880 * 2, rel=1e-9)
    # and the weights still move in 4.25 bits: 36 layers x 128 experts x (3 x 2880^2 weights + 3 x 2880 biases); the
    # biases are counted at the experts' storage size (they ship in BF16: 0.1% of these bytes)
    assert float(np.sum(kt.expert_weight_bytes * kt.count)) == pytest.approx(
        36 * 128 * 3 * (2880 * 2880 + 2880) * 4.25 / 8, rel=1e-9)


def test_fp4_weights_without_fp4_math_run_at_the_fp8_rate():
    kt4, kt8 = table("llama3_8b", "fp4"), table("llama3_8b", "fp8")
    w = decode_work(4096.0, 1.0)  # compute bound
    hopper = chip(fp4_flops_per_s=0.0)
    blackwell = chip(fp4_flops_per_s=2 * 1979e12)
    t_h = float(np.sum(kernel_times(hopper, kt4, IDEAL, Mapping(), w)["t_compute"] * kt4.count))
    t_b = float(np.sum(kernel_times(blackwell, kt4, IDEAL, Mapping(), w)["t_compute"] * kt4.count))
    t_8 = float(np.sum(kernel_times(hopper, kt8, IDEAL, Mapping(), w)["t_compute"] * kt8.count))
    assert t_b < t_h
    assert t_h == pytest.approx(t_8, rel=1e-5)  # FP4 layers at the FP8 rate, exactly as FP8 layers


def test_sram_placement_knob_explicit_versus_cache():
    kt = table("llama3_8b", "bf16")  # ~16 GB of weights
    big_sram = dict(sram_capacity_bytes=8e9, sram_bandwidth_bytes_per_s=1e14)
    w = decode_work(1.0, 1024.0)
    t_cache = float(step_time(chip(**big_sram, sram_explicit_fraction=0.0), kt, IDEAL, Mapping(), w)[0])
    t_pinned = float(step_time(chip(**big_sram, sram_explicit_fraction=1.0), kt, IDEAL, Mapping(), w)[0])
    t_none = float(step_time(chip(), kt, IDEAL, Mapping(), w)[0])
    assert t_cache == pytest.approx(t_none, rel=1e-6)  # a cache smaller than the step's bytes serves nothing
    assert t_pinned < 0.6 * t_none  # half the bytes pinned on chip, streamed alongside HBM
    # explicit placement also adds capacity: 80 GB HBM + 100 GB pinned SRAM holds 141 GB of BF16 70B weights
    kt70 = table("llama3_70b", "bf16")
    sc = scenario()
    for frac, expect in ((0.0, 2), (1.0, 0)):
        c = chip(sram_capacity_bytes=1e11, sram_explicit_fraction=frac)
        assert int(evaluate_point(c, kt70, DEFAULT, sc, Mapping(), 1.0)["infeasible_code"]) == expect


def test_ep_imbalance_gradient_is_finite_without_expert_parallelism():
    # ep = 1: the imbalance is identically 1, so its derivative in the token count is exactly 0 (not NaN, which
    # would poison every gradient of a dense or TP-only mapping through jnp.where)
    import jax

    from serving.routing import ep_imbalance

    assert float(jax.grad(lambda t: ep_imbalance(t, 4.0, 1.0))(10.0)) == 0.0
    g8 = float(jax.grad(lambda t: ep_imbalance(t, 4.0, 8.0))(10.0))
    h = 1e-2
    fd = (float(ep_imbalance(10.0 + h, 4.0, 8.0)) - float(ep_imbalance(10.0 - h, 4.0, 8.0))) / (2 * h)
    assert g8 == pytest.approx(fd, rel=1e-3)


def test_fp4_efficiency_discounts_native_fp4_math_only():
    kt = table("llama3_8b", "fp4")  # NVFP4 linear layers, BF16 lm_head
    w = decode_work(4096.0, 1.0)  # compute bound
    half = dataclasses.replace(IDEAL, fp4_efficiency=0.5)
    blackwell = chip(fp4_flops_per_s=2 * 1979e12)
    full = kernel_times(blackwell, kt, IDEAL, Mapping(), w)
    slow = kernel_times(blackwell, kt, half, Mapping(), w)
    fp4_flops = float(full["flops_by_dtype"][MATH_DTYPES.index("fp4")])
    assert fp4_flops > 0
    # every FP4 FLOP takes 1 / 0.5 as long; the BF16 lm_head does not move
    extra = float(np.sum((slow["t_compute"] - full["t_compute"]) * kt.count))
    assert extra == pytest.approx(fp4_flops / (2 * 1979e12) * (1 / 0.5 - 1), rel=1e-5)
    # on a chip without FP4 math the FP4 layers run at the FP8 rate and the factor does not apply
    hopper = chip(fp4_flops_per_s=0.0)
    a = kernel_times(hopper, kt, IDEAL, Mapping(), w)["t_compute"]
    b = kernel_times(hopper, kt, half, Mapping(), w)["t_compute"]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_prefill_pool_batches_per_attention_replica():
    # a DP replica schedules its own prefill batch (per-rank token budget), so 8 data-parallel replicas on 8 chips
    # prefill exactly as fast per chip as one chip alone (dense model, no collectives under pure DP)
    kt = table("llama3_8b", "fp8")
    # a 1k-token budget: a chip streams its 8 GB of weights for 1k tokens (compute bound), not for 1k / 8
    sc = scenario(kind="disaggregated", prefill_batch_tokens=1024)
    one = evaluate_point(chip(), kt, IDEAL, sc, Mapping(), 64.0)
    dp8 = evaluate_point(chip(), kt, IDEAL, sc, Mapping(dp=8.0), 64.0)
    assert float(dp8["prefill_input_tok_s_per_chip"]) == pytest.approx(float(one["prefill_input_tok_s_per_chip"]),
                                                                        rel=1e-5)


def test_closed_loop_iterations_prefill_whole_prompts():
    # B / OSL < 1 requests replace finished ones per iteration: that share of iterations carries one whole prefill,
    # the rest decode only. Throughput pays every prefill; a request's TPOT only the other B - 1 requests' ones.
    kt = table("qwen3_30b_a3b", "fp8")
    sc = scenario()
    isl, osl = sc.mean_isl_tokens, sc.mean_osl_tokens
    c = chip()

    def capped(w):
        t0, out = step_time(c, kt, DEFAULT, Mapping(), w)
        return float(power_capped(c, out, t0)[0])

    for b in (1.0, 16.0):
        dec = Work(decode_tokens=b, decode_queries=1.0, context=isl + osl / 2, prefill_requests=0.0, prefill_len=isl)
        t_d, t_m = capped(dec), capped(dataclasses.replace(dec, prefill_requests=1.0))
        out = evaluate_point(c, kt, DEFAULT, sc, Mapping(), b)
        assert float(out["tpot_s"]) == pytest.approx((1 - (b - 1) / osl) * t_d + (b - 1) / osl * t_m, rel=1e-5)
        assert float(out["output_tok_s_per_chip"]) == pytest.approx(b / ((1 - b / osl) * t_d + b / osl * t_m),
                                                                    rel=1e-5)
    # spread thin over every step instead, ~0.9 prompt tokens join each batch-1 step and touch up to k more
    # experts in every one of them: slower than the lumpy truth (expected experts are concave in the tokens)
    one = Work(decode_tokens=1.0, decode_queries=1.0, context=isl + osl / 2, prefill_requests=1.0 / osl,
               prefill_len=isl)
    assert float(evaluate_point(c, kt, DEFAULT, sc, Mapping(), 1.0)["tpot_s"]) < 0.9 * capped(one)


def test_attention_dp_prefills_one_prompt_a_replica_in_a_share_of_iterations():
    # dep8: a prompt lives on one replica and the others wait for it, so the engine holds new prompts until each of
    # the 8 replicas has one: a share rho / 8 of iterations carries 8 prompts (rho = B / OSL), one a replica
    kt = table("qwen3_30b_a3b", "fp8")
    sc = scenario()
    isl, osl = sc.mean_isl_tokens, sc.mean_osl_tokens
    c, m = chip(), Mapping(dp=8, ep=8)

    def capped(w):
        t0, out = step_time(c, kt, DEFAULT, m, w)
        return float(power_capped(c, out, t0)[0])

    for b in (1.0, 64.0, 4096.0):
        rho = b / osl
        n = max(rho, 8.0)
        dec = Work(decode_tokens=b, decode_queries=1.0, context=isl + osl / 2, prefill_requests=0.0, prefill_len=isl)
        t_d, t_m = capped(dec), capped(dataclasses.replace(dec, prefill_requests=n))
        out = evaluate_point(c, kt, DEFAULT, sc, m, b)
        share = rho / n
        assert float(out["output_tok_s_per_chip"]) == pytest.approx(b / ((1 - share) * t_d + share * t_m) / 8,
                                                                    rel=1e-5)
        assert float(out["tpot_s"]) == pytest.approx((1 - share * (b - 1) / b) * t_d + share * (b - 1) / b * t_m,
                                                     rel=1e-5)


@pytest.mark.parametrize("kind", ["closed_loop", "offline", "disaggregated"])
def test_padded_kernel_rows_change_nothing(kind):
    """pad_kernels adds rows with count 0: every output of the evaluator equals the unpadded table's (the oracle is
    the same evaluation without padding), so tables of different models can share one compiled shape."""
    from serving.kernel_table import pad_kernels

    kt = table("gpt_oss_120b", "fp4")
    padded = pad_kernels(kt, 32)
    assert padded.num_kernels == 32 and padded.names == ()
    sc = scenario("inferencex_8k1k", kind=kind, prefill_pool_fraction=None)
    maps = stack_mappings(enumerate_mappings(arch("gpt_oss_120b"), 8))
    conc = np.asarray([1, 16, 256], np.float32)
    chips = stack([chip(), chip(hbm_bandwidth_bytes_per_s=4e12)])
    params = ServingParams.from_dict(load_yaml("serving/default.yaml"))
    want = evaluate_grid(chips, kt, params, sc, maps, conc)
    got = evaluate_grid(chips, padded, params, sc, maps, conc)
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]), rtol=1e-6, err_msg=key)
    with pytest.raises(ValueError):
        pad_kernels(kt, kt.num_kernels - 1)


@pytest.mark.parametrize("batch", [1.0, 2.0, 64.0, 512.0])
def test_pipeline_iteration_is_the_stack_at_one_micro_batch(batch):
    """PP over 2 stages: B sequences as min(B, 2) micro-batches (GPipe). Conservation: an iteration's FLOPs per chip
    are the step's FLOPs over all chips whatever the split (tp2pp2 = tp4 for B >= 2; at B = 1 the stages run in
    turn, so a chip does its half of the layers but the iteration lasts the whole stack: tp2's time). Time: the
    stack at B / 2 on tp2 (each stage's weights read once per micro-batch: W / tp per iteration), plus the
    send/recv of one micro-batch's hidden states."""
    kt, c = table("llama3_70b", "fp8"), chip()
    w = decode_work(batch, 1024.0)
    t_pp, out_pp = step_time(c, kt, DEFAULT, Mapping(tp=2, pp=2), w)
    _, out_tp4 = step_time(c, kt, DEFAULT, Mapping(tp=4), w)
    mb = min(batch, 2.0)
    t_half, out_half = step_time(c, kt, DEFAULT, Mapping(tp=2), decode_work(batch / mb, 1024.0))
    flops = lambda o: float(jnp.sum(o["flops_by_dtype"]))
    if batch >= 2:
        assert flops(out_pp) == pytest.approx(flops(out_tp4), rel=1e-5)
    assert flops(out_pp) == pytest.approx(flops(out_half), rel=1e-6)
    p2p = (batch / mb) * 8192 * kt.activation_bytes / (450e9 * DEFAULT.link_efficiency) + 1e-6
    assert float(t_pp) == pytest.approx(float(t_half) + p2p, rel=1e-5)
    # no PP, no change: the step at B itself
    t_tp2, _ = step_time(c, kt, DEFAULT, Mapping(tp=2), w)
    assert float(step_time(c, kt, DEFAULT, Mapping(tp=2, pp=1), w)[0]) == float(t_tp2)


@pytest.mark.parametrize("name", ["llama3_70b", "gpt_oss_120b", "qwen3_30b_a3b", "deepseek_r1", "llama4_maverick"])
def test_tensor_parallel_all_reduces_twice_per_layer_dense_or_moe(name):
    """Megatron-LM TP (Shoeybi et al. 2019): one all-reduce after the attention output projection and one after the
    FFN, whatever the FFN is. With TP-sharded experts (tp8, ep = 1) a MoE layer's routed-expert output is a partial
    sum, reduced on its own (gpt-oss, Qwen3) or in the shared expert's buffer (DeepSeek, Llama 4). Closed form: link
    bytes per step = layers x 2 x B x hidden x activation bytes x 2 (g - 1) / g (ring, Patarasuk & Yuan 2009). So
    does tp8ep8 (EP without attention-DP: every rank holds all B tokens, as vLLM's --enable-expert-parallel at TP 8).
    Under tp2dep4 (attention-DP) the experts all-to-all instead: each replica all-reduces its B / 4 tokens over tp 2
    once per layer (twice on dense layers and with a shared expert) and dispatches and combines its ranks' B / 8
    local tokens' k copies, (ep - 1) / ep of them leaving the rank, on every MoE layer: dispatched in FP8 with an
    FP32 scale per 128 channels where the experts compute in FP8 (DeepSeek-V3 report sec. 3.3.2; DeepEP), in BF16
    where they compute in BF16 (gpt-oss's "fp8" recipe keeps its MXFP4 experts W4A16), combined in BF16."""
    a, kt, b = arch(name), table(name, "fp8"), 64.0
    ab, h = kt.activation_bytes, a.hidden_size
    want = a.num_layers * 2 * b * h * ab * 2 * 7 / 8
    for m in (Mapping(tp=8), Mapping(tp=8, ep=8)) if a.num_experts else (Mapping(tp=8),):
        out = kernel_times(chip(), kt, DEFAULT, m, decode_work(b, 1024.0))
        assert float(out["link_bytes"]) == pytest.approx(want, rel=1e-6)
    if a.num_experts:
        moe_layers = sum(1 for k in a.layer_kinds() if k.ffn == "moe")
        dep = kernel_times(chip(), kt, DEFAULT, Mapping(tp=2, dp=4, ep=8), decode_work(b, 1024.0))
        shared = 1 if "shared_expert" in kt.names else 0  # its all-reduce stays under EP
        ars = a.num_layers + (a.num_layers - moe_layers) + shared * moe_layers
        dispatch = 2.0 if name.startswith("gpt_oss") else 1.0 + 4.0 / 128
        a2a = moe_layers * (b / 8) * a.experts_per_token * h * (dispatch + ab) * 7 / 8
        assert float(dep["link_bytes"]) == pytest.approx(ars * (b / 4) * h * ab * 2 * 1 / 2 + a2a, rel=1e-6)


@pytest.mark.parametrize("precision,dispatch", [("fp8", 1.0 + 4.0 / 128), ("bf16", 2.0)])
def test_ep_dispatch_and_combine_times_in_closed_form(precision, dispatch):
    """DeepSeek-R1 (models.md: hidden 7168, 8 experts per token) on dep8 inside one 8-chip scale-up domain: each of
    the 8 ranks holds B / 8 tokens and sends 7/8 of their 8 copies to other ranks, once to dispatch and once to
    combine; each way costs bytes / (link bw x efficiency) + log2(8) hops x 1 us + one collective call. The dispatch
    moves FP8 with an FP32 scale per 128 channels when the experts compute in FP8 (DeepSeek-V3 report sec. 3.3.2;
    DeepEP), BF16 when they compute in BF16; the combine moves BF16 either way."""
    kt = table("deepseek_r1", precision)
    i = kt.names.index("experts")
    b, call, eff = 512.0, 5e-6, 0.8
    p = dataclasses.replace(IDEAL, collective_overhead_s=call, link_efficiency=eff)
    out = kernel_times(chip(), kt, p, Mapping(dp=8, ep=8), decode_work(b, 1024.0))

    def one_way(elem_bytes):
        return (b / 8) * 8 * 7168 * elem_bytes * 7 / 8 / (450e9 * eff) + 3 * 1e-6 + call

    assert float(out["t_comm"][i]) == pytest.approx(one_way(dispatch) + one_way(2.0), rel=1e-6)


@pytest.mark.parametrize("batch", [1, 8, 64, 1024])
def test_expert_compute_follows_the_floored_moe_curve_in_closed_form(batch):
    """DeepSeek-R1's routed experts (models.md: 256 experts, 8 per token, hidden 7168, expert FFN 2048, SwiGLU:
    3 matrices) on one FP8 chip: FLOPs = 2 x 3 x 7168 x 2048 x 8 per token, plus the gate-weighted sum of the 8
    expert outputs (a [8] x [8, 7168] contraction: 2 x 8 x 7168); rows per touched expert = 8 B / (256 (1 -
    (1 - 8/256)^B)); compute = FLOPs / (rate e_max) x (1 + half / (rows + floor)). And the floor's point: below ~floor
    rows per expert the compute shrinks with the rows, so at batch 1 it is the floor-free curve's (1 + half /
    (rows + floor)) / (1 + half / rows) share, far under it, while at 1024 sequences (32 rows) the two nearly agree."""
    kt = table("deepseek_r1", "fp8")
    i = kt.names.index("experts")
    half, floor, e = 400.0, 16.0, 0.2
    p = dataclasses.replace(IDEAL, moe_efficiency_max=e, moe_rows_half=half, moe_rows_floor=floor)
    c = chip()
    out = kernel_times(c, kt, p, Mapping(), decode_work(float(batch), 1024.0))
    touched = 256 * (1 - (1 - 8 / 256) ** batch)
    rows = 8 * batch / touched
    flops = (2 * 3 * 7168 * 2048 * 8 + 2 * 8 * 7168) * batch
    want = flops / (1979e12 * e) * (1 + half / (rows + floor))
    assert float(out["t_compute"][i]) == pytest.approx(want, rel=1e-4)
    plain = kernel_times(c, kt, dataclasses.replace(p, moe_rows_floor=0.0), Mapping(), decode_work(float(batch), 1024.0))
    ratio = float(out["t_compute"][i]) / float(plain["t_compute"][i])
    assert ratio == pytest.approx((1 + half / (rows + floor)) / (1 + half / rows), rel=1e-4)
    assert ratio < 0.1 if batch == 1 else ratio < 1.0
    # a dense GEMM's curve has no floor
    j = kt.names.index("o_proj")
    assert float(out["t_compute"][j]) == pytest.approx(float(plain["t_compute"][j]), rel=1e-6)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gemm_compute_follows_the_contraction_depth_term_in_closed_form(tp):
    """Llama 3 8B (hidden 4096, FFN 14336, 32 q heads of 128) at FP8, prefill of 2048 tokens: the o_proj GEMM
    contracts over 32 x 128 = 4096 (row-parallel: 4096 / tp per chip) and the MLP over 4096 (gate, up: 2/3 of its
    FLOPs) and 14336 (down, row-parallel: 1/3), so with k_half the compute time is the depth-free one times
    1 + k_half x mean(1 / K per chip). The qkv GEMM's K (4096) does not split; attention has no depth term."""
    kt = table("llama3_8b", "fp8")
    k_half = 300.0
    deep = dataclasses.replace(IDEAL, gemm_k_half=k_half)
    work = Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=1.0, prefill_len=2048.0)
    m = Mapping(tp=float(tp))
    with_k = kernel_times(chip(), kt, deep, m, work)["t_compute"]
    without = kernel_times(chip(), kt, IDEAL, m, work)["t_compute"]
    want = {"o_proj": 1 + k_half * tp / 4096,
            "mlp": 1 + k_half * (2 / 3 / 4096 + 1 / 3 * tp / 14336),
            "qkv_proj": 1 + k_half / 4096,
            "attention": 1.0}
    for name, ratio in want.items():
        i = kt.names.index(name)
        assert float(with_k[i]) / float(without[i]) == pytest.approx(ratio, rel=1e-5), name


@pytest.mark.parametrize("tp,ep", [(8, 8), (8, 1), (4, 2)])
def test_expert_depth_splits_over_the_chips_sharing_an_expert(tp, ep):
    """DeepSeek-R1's routed experts (models.md: hidden 7168, expert FFN 2048; FLOPs per token 2 x 3 x 7168 x 2048 x 8
    plus the weightless combine 2 x 8 x 7168): gate / up contract over 7168, down over 2048, which splits over the
    tp / ep chips that share one expert (8 / 8: whole experts, 8 / 1: every expert TP-sharded 8 ways)."""
    kt = table("deepseek_r1", "fp8")
    i = kt.names.index("experts")
    k_half = 500.0
    deep = dataclasses.replace(IDEAL, gemm_k_half=k_half)
    m = Mapping(tp=float(tp), ep=float(ep))
    w = decode_work(256.0, 1024.0)
    ratio = float(kernel_times(chip(), kt, deep, m, w)["t_compute"][i]) / float(
        kernel_times(chip(), kt, IDEAL, m, w)["t_compute"][i])
    weights, combine = 2 * 3 * 7168 * 2048 * 8, 2 * 8 * 7168
    over_k = 2 * 2 * 2048 * 8 + 2 * 7168 * 8 * (tp / ep)  # sum of FLOPs / K per token
    assert ratio == pytest.approx(1 + k_half * over_k / (weights + combine), rel=1e-5)


@settings(max_examples=20, deadline=None)
@given(vals=chip_values, factor=st.floats(1.0, 8.0))
def test_a_deeper_pipeline_penalty_never_speeds_anything_up(vals, factor):
    """gemm_k_half only ever adds compute time: a larger one never lowers TPOT / TTFT or raises throughput."""
    c = stack([chip(**vals)])
    base = {k: np.asarray(v) for k, v in evaluate_grid(c, KT_MOE, DEFAULT, SC, MAPS, CONC).items()}
    more_p = dataclasses.replace(DEFAULT, gemm_k_half=DEFAULT.gemm_k_half * factor)
    more = {k: np.asarray(v) for k, v in evaluate_grid(c, KT_MOE, more_p, SC, MAPS, CONC).items()}
    for k in ("tpot_s", "ttft_s"):
        assert np.all(more[k] >= base[k] * (1 - 1e-5)), k
    assert np.all(more["total_tok_s_per_chip"] <= base["total_tok_s_per_chip"] * (1 + 1e-5))


@pytest.mark.parametrize("workload,tp,group", [
    ("llama3_8b", 1, 4),      # 32 query heads over 8 KV heads
    ("llama3_8b", 8, 4),      # 4 query heads and 1 KV head per chip
    ("llama3_8b", 16, 2),     # 2 query heads per chip; the 8 KV heads replicated, 1 per chip
    ("deepseek_r1", 1, 128),  # absorbed MLA: all 128 heads share the latent
    ("deepseek_r1", 8, 16),
])
@pytest.mark.parametrize("batch", [1.0, 64.0])
def test_attention_rows_are_one_sequences_not_the_batchs(workload, tp, group, batch):
    """Each sequence attends over its own keys, so a decode step's attention rows are one sequence's query heads per
    KV head on the chip times its query tokens (1 + MTP drafts), whatever the batch, and a prefill's rows are its
    prompt's tokens, whatever the number of prompts: with rows_half h the compute time is the h = 0 one times
    (1 + h / rows). A step that does both pays each part at its own rows."""
    from serving.kernel_table import KIND_ATTENTION

    kt = table(workload, "fp8")
    att = np.flatnonzero(np.asarray(kt.kind) == KIND_ATTENTION)
    assert att.size
    half = 64.0
    p = dataclasses.replace(IDEAL, attention_rows_half=half)
    m = Mapping(tp=float(tp))

    def compute(params, w):
        return np.asarray(kernel_times(chip(), kt, params, m, w)["t_compute"])[att]

    for queries in (1.0, 2.0):
        w = Work(decode_tokens=batch, decode_queries=queries, context=2048.0, prefill_requests=0.0, prefill_len=1.0)
        np.testing.assert_allclose(compute(p, w) / compute(IDEAL, w), 1 + half / (group * queries), rtol=1e-5)
    length = 1024.0
    pre = Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=batch, prefill_len=length)
    np.testing.assert_allclose(compute(p, pre) / compute(IDEAL, pre), 1 + half / length, rtol=1e-5)
    dec = Work(decode_tokens=batch, decode_queries=1.0, context=2048.0, prefill_requests=0.0, prefill_len=length)
    both = dataclasses.replace(dec, prefill_requests=batch)
    np.testing.assert_allclose(compute(p, both), compute(p, dec) + compute(p, pre), rtol=1e-5)


@pytest.mark.parametrize("batch", [1.0, 4.0, 8.0, 64.0])
def test_attention_dp_runs_the_busiest_replicas_share(batch):
    """Under attention-DP each replica holds its own sequences and every rank waits for the busiest at the experts'
    all-to-all, so on dep8 the attention and dense kernels of a chip do one replica's work: max(B / 8, 1) sequences
    (a lone sequence lives whole on one replica), exactly what one chip without DP does for that many; a lone
    prompt's prefill is one replica's whole prefill, not an eighth of it."""
    kt = table("deepseek_r1", "fp8")
    rest = np.asarray(kt.group) != GROUP_EXPERTS
    for work, share in ((decode_work(batch, 1024.0), decode_work(max(batch / 8.0, 1.0), 1024.0)),
                        (Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=1.0,
                              prefill_len=8192.0),) * 2):
        dep = kernel_times(chip(), kt, IDEAL, Mapping(dp=8, ep=8), work)
        one = kernel_times(chip(), kt, IDEAL, Mapping(), share)
        for k in ("t_compute", "t_memory"):
            assert np.asarray(dep[k])[rest] == pytest.approx(np.asarray(one[k])[rest], rel=1e-5)


def test_mla_down_projections_are_held_whole_by_every_tp_rank():
    """DeepSeek-R1 in FP8 (models.md: hidden 7168, q_lora_rank 1536, kv_lora_rank 512 + rope 64): q_a_proj and
    kv_a_proj are ReplicatedLinear in vLLM and SGLang, so on tp8 each chip reads their whole weights (at least the
    7168 x 1536 and 7168 x 576 FP8 values) and does their whole FLOPs, while q_b_proj splits over the 8 ranks; the
    weights per chip for memory carry them whole too."""
    kt = table("deepseek_r1", "fp8")
    w = decode_work(1.0, 1024.0)
    one = kernel_times(chip(), kt, IDEAL, Mapping(), w)
    tp8 = kernel_times(chip(), kt, IDEAL, Mapping(tp=8, ep=8), w)
    names = list(kt.names)
    for op, (k, n) in {"q_a_proj": (7168, 1536), "kv_a_proj": (7168, 576)}.items():
        i = names.index(op)
        assert float(kt.weight_bytes[i]) >= k * n and float(kt.tp_replicated[i]) == 1.0
        assert float(tp8["t_memory"][i]) == pytest.approx(float(one["t_memory"][i]), rel=1e-6)
        assert float(tp8["t_compute"][i]) == pytest.approx(float(one["t_compute"][i]), rel=1e-6)
    i = names.index("q_b_proj")
    assert float(tp8["t_compute"][i]) == pytest.approx(float(one["t_compute"][i]) / 8, rel=1e-5)
    whole = sum(float(kt.weight_bytes[names.index(op)] * kt.count[names.index(op)]) for op in ("q_a_proj", "kv_a_proj"))
    w1 = float(memory_terms(chip(), kt, IDEAL, Mapping(tp=8), 1024.0)[0])
    w8 = float(memory_terms(chip(), kt, IDEAL, Mapping(tp=8, ep=8), 1024.0)[0])
    experts = float(np.sum(kt.expert_weight_bytes * kt.count))
    assert w8 == pytest.approx((kt.weight_bytes_total - experts - whole) / 8 + whole + experts / 8, rel=1e-6)
    assert w1 == pytest.approx(w8, rel=1e-6)  # tp8 with ep = 1 shards the experts over tp just the same


@pytest.mark.parametrize("tokens,tolerance", [(1, 0.08), (4, 0.04), (16, 0.03), (64, 0.03), (256, 0.01)])
def test_busiest_ep_rank_experts_match_a_simulation(tokens, tolerance):
    """DeepSeek-R1's routing (256 experts, 8 per token) over 8 EP ranks of 32 experts: the expected number of touched
    experts on the busiest rank against a Monte Carlo of the routing (2000 steps). The normal approximation is
    coarsest at one token (a rank's count ~Binomial(32, 1/32)), hence the wider tolerance there."""
    from serving.routing import busiest_rank_experts

    rng = np.random.default_rng(0)
    E, k, ep, steps = 256, 8, 8, 2000
    picks = np.argsort(rng.random((steps, tokens, E)), axis=2)[:, :, :k]  # k distinct experts per token
    touched = np.zeros((steps, E), bool)
    np.put_along_axis(touched, picks.reshape(steps, -1), True, axis=1)
    simulated = touched.reshape(steps, ep, E // ep).sum(axis=2).max(axis=1).mean()
    assert float(busiest_rank_experts(float(E), float(k), float(tokens), float(ep))) == pytest.approx(
        simulated, rel=tolerance)
    assert float(busiest_rank_experts(float(E), float(k), float(tokens), 1.0)) == pytest.approx(
        E * (1 - (1 - k / E) ** tokens), rel=1e-5)  # one rank holds every touched expert


def test_a_low_batch_ep_step_streams_the_busiest_ranks_experts():
    """At one DeepSeek-R1 token on tp8ep8 the experts kernel's bytes per chip are the busiest rank's ~2.4 experts,
    not the mean's 1; TP-sharded experts (tp8, ep = 1) read an eighth of each of the 8 touched experts: the mean."""
    from serving.routing import busiest_rank_experts

    kt = table("deepseek_r1", "fp4")
    i = list(kt.names).index("experts")
    p = dataclasses.replace(IDEAL, memory_bytes_half=1e-30)
    w = decode_work(1.0, 1024.0)
    ep8 = kernel_times(chip(sram_capacity_bytes=1.0), kt, p, Mapping(tp=8, ep=8), w)
    tp8 = kernel_times(chip(sram_capacity_bytes=1.0), kt, p, Mapping(tp=8), w)
    per_expert = float(kt.expert_weight_bytes[i]) / 256
    busiest = float(busiest_rank_experts(256.0, 8.0, 1.0, 8.0))
    act = float(tp8["t_memory"][i]) * 3.35e12 - 8 * per_expert / 8
    assert float(ep8["t_memory"][i]) * 3.35e12 == pytest.approx(busiest * per_expert + act, rel=1e-4)
    assert 2.2 < busiest < 2.7
