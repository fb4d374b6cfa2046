"""Sensitivities at matched interactivity, time attribution and roofline points against independent oracles.

Oracles: central finite differences that re-solve the matched concurrency with a bisection written here (not the
module's), the closed form of a bandwidth-bound decode (t_step = bytes / bandwidth + overhead), the step times of
serving.perf / serving.serve, and the FFN FLOPs of Llama 3 8B from its published shape.
"""

import dataclasses
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf
from hypothesis import given, settings
from hypothesis import strategies as st

from arch_space.chip import NUMERIC_FIELDS, Chip
from serving.architecture import ModelArchitecture
from serving.kernel_table import build_kernel_table
from serving.perf import Mapping, ServingParams, Work, kernel_times, power_capped, step_time
from serving.precision import Precision
from serving.scenario import Scenario
from serving.sensitivity import (METHOD_ABSENT, METHOD_CAPACITY, METHOD_GRADIENT, METHOD_STEP, METHOD_UNREACHABLE,
                                 RESOURCES, SOFTWARE, matched_concurrency, resource_sensitivities, roofline_points,
                                 time_attribution)
from serving.serve import evaluate_point
from conftest import load_yaml

# a pinned parameter set (fixtures/serving_params.yaml): the constructed cases below must not move with a refit
PARAMS = ServingParams.from_dict(OmegaConf.to_container(OmegaConf.load(Path(__file__).parent / "fixtures" /
                                                                       "serving_params.yaml")))
TINY = 1e-9
IDEAL = ServingParams(gemm_efficiency_max=1.0, gemm_rows_half=TINY, attention_efficiency_max=1.0,
                      attention_rows_half=TINY, moe_efficiency_max=1.0, moe_rows_half=TINY,
                      memory_efficiency_max=1.0, memory_bytes_half=TINY, link_efficiency=1.0, kernel_overhead_s=0.0,
                      step_overhead_s=2e-4, comm_overlap=0.0, hbm_reserve_fraction=0.1)
# Llama 3 8B (models.md): 32 layers, hidden 4096, 32 q / 8 kv heads of 128, FFN 14336, vocab 128256, untied.
V, H, L, QD, KVD, F = 128256, 4096, 32, 4096, 1024, 14336
LLAMA3_8B_PARAMS = V * H * 2 + L * (H * (QD + 2 * KVD) + QD * H + 3 * H * F + 2 * H) + H


def preset(name, **changes) -> Chip:
    c = Chip.from_dict(load_yaml(f"hardware/{name}.yaml"))
    return Chip(**{f: float(getattr(c, f)) for f in NUMERIC_FIELDS} | changes)


def table(workload, precision):
    arch = ModelArchitecture.from_dict(load_yaml(f"workload/{workload}.yaml"))
    return build_kernel_table(arch, Precision.from_dict(load_yaml(f"precision/{precision}.yaml")))


def scenario(name="inferencex_1k1k", **kw):
    return dataclasses.replace(Scenario.from_dict(load_yaml(f"scenario/{name}.yaml")), **kw)


KT8 = table("llama3_8b", "fp8")
KT16 = table("llama3_8b", "bf16")
SC = scenario()
_point = jax.jit(evaluate_point)


def point(chip, kt, p, sc, m, c):
    return {k: float(v) for k, v in _point(chip, kt, p, sc, m, c).items()}


def solve(chip, kt, p, sc, m, target):
    """The oracle's own matched concurrency: plain bisection on log B over [1, 2^20] with the model's interactivity."""
    lo, hi = 0.0, 20 * math.log(2.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if point(chip, kt, p, sc, m, math.exp(mid))["interactivity_tok_s_user"] >= target:
            lo = mid
        else:
            hi = mid
    return math.exp(lo)


def matched_metric(chip, kt, p, sc, m, target, metric="total_tok_s_per_kw"):
    return point(chip, kt, p, sc, m, solve(chip, kt, p, sc, m, target))[metric]


# ---------------------------------------------------------------------------------------------- matched concurrency
def test_matched_concurrency_gives_the_target_interactivity():
    chip = preset("h100_sxm")
    for target in (30.0, 100.0, 160.0):
        c = matched_concurrency(chip, KT8, PARAMS, SC, Mapping(), target)
        assert c > 1.0
        got = point(chip, KT8, PARAMS, SC, Mapping(), c)["interactivity_tok_s_user"]
        assert got == pytest.approx(target, rel=1e-3)
        assert c == pytest.approx(solve(chip, KT8, PARAMS, SC, Mapping(), target), rel=1e-4)
    assert math.isnan(matched_concurrency(chip, KT8, PARAMS, SC, Mapping(), 1e5))  # B = 1 is slower
    assert math.isnan(matched_concurrency(chip, KT8, PARAMS, SC, Mapping(), 1e-6))  # faster even at 2^20


# ---------------------------------------------------------------------------------------------- sensitivities
DESIGNS = [
    # a preset, a dense workload, tensor parallel (derivatives in B by central difference: ep = 1)
    ("h100_sxm", {}, "llama3_8b", "fp8", "inferencex_1k1k", Mapping(tp=2), 60.0),
    # a preset, MoE with expert parallelism (derivatives in B from JAX)
    ("b200", {}, "gpt_oss_20b", "fp8", "inferencex_8k1k", Mapping(tp=2, ep=2), 150.0),
    # modified figures: 3x compute, 2x HBM bandwidth, 4 GB of explicitly placed SRAM (a quarter of the BF16
    # weights stream from it, so its capacity has a smooth gradient)
    ("h100_sxm", dict(bf16_flops_per_s=3e15, fp8_flops_per_s=6e15, hbm_bandwidth_bytes_per_s=6.7e12,
                      sram_capacity_bytes=4e9, sram_explicit_fraction=1.0, sram_bandwidth_bytes_per_s=3e13),
     "llama3_8b", "bf16", "inferencex_1k1k", Mapping(), 120.0),
]


@pytest.mark.parametrize("design", DESIGNS, ids=["h100_llama8b_tp2", "b200_gptoss20b_tp2ep2", "modified_h100"])
def test_gradient_sensitivities_match_central_differences(design):
    name, changes, workload, precision, sc_name, m, target = design
    chip, kt, sc = preset(name, **changes), table(workload, precision), scenario(sc_name)
    rows = resource_sensitivities(chip, kt, PARAMS, sc, m, target)
    assert [r["resource"] for r in rows] == [f for f, _ in RESOURCES] + ["serving." + f for f, _ in SOFTWARE]
    h = 1e-3
    base = matched_metric(chip, kt, PARAMS, sc, m, target)
    checked = set()
    for row in rows:
        assert set(row) == {"resource", "label", "elasticity", "gain_pct_gradient", "gain_pct_fd", "method"}
        assert all(isinstance(row[k], float) for k in ("elasticity", "gain_pct_gradient", "gain_pct_fd"))
        if row["resource"].startswith("serving."):  # software: the gain is for 10% less, against the oracle
            field = row["resource"].removeprefix("serving.")
            assert row["gain_pct_gradient"] == pytest.approx(-10.0 * row["elasticity"], rel=1e-9, abs=1e-12)
            k = getattr(PARAMS, field)
            less = matched_metric(chip, kt, dataclasses.replace(PARAMS, **{field: k * 0.9}), sc, m, target)
            assert row["method"] == METHOD_GRADIENT and row["gain_pct_fd"] > 0.0
            assert row["gain_pct_fd"] == pytest.approx(100.0 * (less / base - 1.0), rel=1e-3, abs=1e-3)
            up, down = (matched_metric(chip, kt, dataclasses.replace(PARAMS, **{field: k * f}), sc, m, target)
                        for f in (1 + h, 1 - h))
            e_fd = (math.log(up) - math.log(down)) / (math.log(1 + h) - math.log(1 - h))
            assert row["elasticity"] == pytest.approx(e_fd, rel=0.05), row
            checked.add(row["resource"])
            continue
        assert row["gain_pct_gradient"] == pytest.approx(10.0 * row["elasticity"], rel=1e-9, abs=1e-12)
        r = getattr(chip, row["resource"])
        if row["method"] == METHOD_ABSENT:
            assert r == 0.0 and row["gain_pct_fd"] == 0.0
            continue
        assert row["method"] == METHOD_GRADIENT, row
        # the actual +10% gain, re-solved by the oracle
        more = matched_metric(dataclasses.replace(chip, **{row["resource"]: r * 1.1}), kt, PARAMS, sc, m, target)
        assert row["gain_pct_fd"] == pytest.approx(100.0 * (more / base - 1.0), rel=1e-3, abs=1e-3)
        if abs(row["elasticity"]) <= 0.01:
            continue
        up = matched_metric(dataclasses.replace(chip, **{row["resource"]: r * (1 + h)}), kt, PARAMS, sc, m, target)
        down = matched_metric(dataclasses.replace(chip, **{row["resource"]: r * (1 - h)}), kt, PARAMS, sc, m, target)
        e_fd = (math.log(up) - math.log(down)) / (math.log(1 + h) - math.log(1 - h))
        assert row["elasticity"] == pytest.approx(e_fd, rel=0.05), row
        checked.add(row["resource"])
    assert {"hbm_bandwidth_bytes_per_s", "power_rating_w", "serving.kernel_overhead_s"} <= checked
    if chip.sram_explicit_fraction > 0:
        assert "sram_capacity_bytes" in checked


def test_closed_form_bandwidth_bound_decode():
    # Compute ~free, no SRAM, no power cap, ideal memory efficiency: t_step(B) = (W + K B) / bw + O with W the weight
    # bytes, K the bytes per sequence (KV, activations, its share of chunked prefill), O the step overhead. At the
    # target, t_step = T = 1 / I*, so c* = ((T - O) bw - W) / K and throughput ~ c* (fixed TPOT): its elasticity in bw
    # is (T - O) bw / ((T - O) bw - W) = (T - O) / (T - O - W / bw), and 0 in compute.
    bw = 3.35e12
    chip = preset("h100_sxm", bf16_flops_per_s=1e20, fp8_flops_per_s=1e20, int8_flops_per_s=1e20,
                  sram_capacity_bytes=1.0, hbm_bandwidth_bytes_per_s=bw, power_rating_w=1e6, hbm_capacity_bytes=1e12)
    weights = (LLAMA3_8B_PARAMS - V * H) * 2  # every weight but the input embedding (a row gather), BF16
    t_w = weights / bw
    for target in (100.0, 150.0):
        t = 1.0 / target
        expected = (t - IDEAL.step_overhead_s) / (t - IDEAL.step_overhead_s - t_w)
        rows = {r["resource"]: r for r in resource_sensitivities(chip, KT16, IDEAL, SC, Mapping(), target)}
        assert rows["hbm_bandwidth_bytes_per_s"]["elasticity"] == pytest.approx(expected, rel=2e-3)
        # c* is affine in bw, so the actual +10% gain equals the linearised one
        assert rows["hbm_bandwidth_bytes_per_s"]["gain_pct_fd"] == pytest.approx(10.0 * expected, rel=2e-3)
        for f in ("bf16_flops_per_s", "fp8_flops_per_s"):
            assert abs(rows[f]["elasticity"]) < 1e-3 and abs(rows[f]["gain_pct_fd"]) < 1e-2
        assert rows["power_rating_w"]["elasticity"] == pytest.approx(-1.0, rel=1e-4)  # per rated kW, never capped
        assert rows["hbm_capacity_bytes"]["elasticity"] == 0.0 and rows["hbm_capacity_bytes"]["gain_pct_fd"] == 0.0


def test_closed_form_overhead_bound_decode():
    # As above with a launch overhead k on each of the n kernel executions of every iteration: t_step(B) = (W + K B)
    # / bw + O + n k, so c* = ((T - O - n k) bw - W) / K, affine in k: its elasticity in k is
    # -n k / (T - O - n k - W / bw), and 10% less k gains exactly -10 x that. The HBM elasticity becomes
    # (T - O - n k) / (T - O - n k - W / bw): the overhead eats the step's budget, so bandwidth pays more.
    bw, k = 3.35e12, 5e-6
    chip = preset("h100_sxm", bf16_flops_per_s=1e20, fp8_flops_per_s=1e20, int8_flops_per_s=1e20,
                  sram_capacity_bytes=1.0, hbm_bandwidth_bytes_per_s=bw, power_rating_w=1e6, hbm_capacity_bytes=1e12)
    p = dataclasses.replace(IDEAL, kernel_overhead_s=k)
    n = float(np.sum(np.asarray(KT16.count)))
    t_w = (LLAMA3_8B_PARAMS - V * H) * 2 / bw
    for target in (60.0, 100.0):
        budget = 1.0 / target - IDEAL.step_overhead_s - n * k
        rows = {r["resource"]: r for r in resource_sensitivities(chip, KT16, p, SC, Mapping(), target)}
        over = rows["serving.kernel_overhead_s"]
        assert over["label"] == "per-kernel overhead (-10%)" and over["method"] == METHOD_GRADIENT
        assert over["elasticity"] == pytest.approx(-n * k / (budget - t_w), rel=2e-3)
        assert over["gain_pct_fd"] == pytest.approx(10.0 * n * k / (budget - t_w), rel=2e-3)
        assert over["gain_pct_gradient"] == pytest.approx(over["gain_pct_fd"], rel=2e-3)
        assert rows["hbm_bandwidth_bytes_per_s"]["elasticity"] == pytest.approx(budget / (budget - t_w), rel=2e-3)
    # no overhead: nothing to gain from less of it
    none = {r["resource"]: r for r in resource_sensitivities(chip, KT16, IDEAL, SC, Mapping(), 100.0)}
    assert none["serving.kernel_overhead_s"]["method"] == METHOD_ABSENT
    assert none["serving.kernel_overhead_s"]["gain_pct_fd"] == 0.0


def test_absent_unreachable_and_capacity_bound_cases():
    h100 = preset("h100_sxm")
    rows = {r["resource"]: r for r in resource_sensitivities(h100, KT8, PARAMS, SC, Mapping(), 100.0)}
    assert rows["fp4_flops_per_s"]["method"] == METHOD_ABSENT and rows["fp4_flops_per_s"]["gain_pct_fd"] == 0.0
    # B = 1 misses the target
    for r in resource_sensitivities(h100, KT8, PARAMS, SC, Mapping(), 1e5):
        assert r["method"] in (METHOD_ABSENT, METHOD_UNREACHABLE)
        if r["method"] == METHOD_UNREACHABLE:
            assert math.isnan(r["elasticity"]) and math.isnan(r["gain_pct_fd"])
    # 20 GB of HBM: BF16 weights W take 16 GB, 0.9 x 20 GB - W holds the KV of few sequences at 2048 tokens
    small = preset("h100_sxm", hbm_capacity_bytes=20e9)
    kv_per_seq = 2 * KVD * L * 2 * (SC.isl_tokens + SC.osl_tokens)
    c_mem = (0.9 * 20e9 - LLAMA3_8B_PARAMS * 2) / kv_per_seq
    assert 2.0 < c_mem < 20.0
    low = point(small, KT16, PARAMS, SC, Mapping(), 4.0 * c_mem)["interactivity_tok_s_user"]
    assert all(r["method"] in (METHOD_ABSENT, METHOD_UNREACHABLE)
               for r in resource_sensitivities(small, KT16, PARAMS, SC, Mapping(), low))
    # c* just inside the capacity: +10% HBM bandwidth would raise c* past it, the batch stops at capacity
    target = point(small, KT16, PARAMS, SC, Mapping(), 0.98 * c_mem)["interactivity_tok_s_user"]
    rows = {r["resource"]: r for r in resource_sensitivities(small, KT16, PARAMS, SC, Mapping(), target)}
    bw = rows["hbm_bandwidth_bytes_per_s"]
    assert bw["method"] == METHOD_CAPACITY
    faster = dataclasses.replace(small, hbm_bandwidth_bytes_per_s=small.hbm_bandwidth_bytes_per_s * 1.1)
    base = point(small, KT16, PARAMS, SC, Mapping(), solve(small, KT16, PARAMS, SC, Mapping(), target))
    capped = point(faster, KT16, PARAMS, SC, Mapping(), c_mem)
    expected = 100.0 * (capped["total_tok_s_per_kw"] / base["total_tok_s_per_kw"] - 1.0)
    assert bw["gain_pct_fd"] == pytest.approx(expected, rel=1e-2)
    assert 0.0 < bw["gain_pct_fd"] < bw["gain_pct_gradient"]


def test_a_cache_that_starts_to_fit_is_a_step_not_a_gradient():
    # a hardware-managed SRAM just below the step's resident bytes (~9.5 GB of FP8 weights + KV at c*) serves nothing;
    # 10% more holds them, which no derivative sees
    chip = preset("h100_sxm", sram_capacity_bytes=8.8e9, sram_bandwidth_bytes_per_s=3e13)
    rows = {r["resource"]: r for r in resource_sensitivities(chip, KT8, PARAMS, SC, Mapping(), 150.0)}
    sram = rows["sram_capacity_bytes"]
    assert sram["elasticity"] == 0.0 and sram["gain_pct_gradient"] == 0.0
    assert sram["method"] == METHOD_STEP and sram["gain_pct_fd"] > 1.0


@settings(max_examples=8, deadline=None)
@given(bw=st.floats(1e12, 2e13), factor=st.floats(1.05, 3.0), rate=st.floats(5e14, 1e16),
       target=st.sampled_from([40.0, 100.0]))
def test_more_hbm_bandwidth_never_lowers_the_matched_metric(bw, factor, rate, target):
    chip = preset("h100_sxm", hbm_bandwidth_bytes_per_s=bw, fp8_flops_per_s=rate, hbm_capacity_bytes=1e12)
    more = dataclasses.replace(chip, hbm_bandwidth_bytes_per_s=bw * factor)
    values = []
    for c in (chip, more):
        b = matched_concurrency(c, KT8, PARAMS, SC, Mapping(), target)
        values.append(point(c, KT8, PARAMS, SC, Mapping(), b)["total_tok_s_per_kw"] if math.isfinite(b) else 0.0)
    assert values[1] >= values[0] * (1 - 1e-5)
    row = next(r for r in resource_sensitivities(chip, KT8, PARAMS, SC, Mapping(), target)
               if r["resource"] == "hbm_bandwidth_bytes_per_s")
    assert math.isnan(row["gain_pct_fd"]) or row["gain_pct_fd"] >= -1e-3


# ---------------------------------------------------------------------------------------------- time attribution
def _model_step(chip, kt, p, m, w):
    t0, out = step_time(chip, kt, p, m, w)
    return float(power_capped(chip, out, t0)[0])


@pytest.mark.parametrize("m", [Mapping(), Mapping(tp=2, pp=2)], ids=["tp1", "tp2pp2"])
def test_time_attribution_sums_to_the_model_step_times(m):
    sc = scenario("inferencex_8k1k")
    isl, osl = sc.mean_isl_tokens, sc.mean_osl_tokens
    for chip in (preset("h100_sxm"), preset("h100_sxm", hbm_bandwidth_bytes_per_s=3e13, power_rating_w=200.0)):
        b = 64.0
        parts = time_attribution(chip, KT8, PARAMS, sc, m, b)
        # b / osl < 1 request replaces a finished one per iteration: that share of iterations prefills one whole
        # prompt, the rest only decode; a request's TPOT sees the prefills of the b - 1 others
        rho = (b - 1) / osl
        decode = Work(decode_tokens=b, decode_queries=1.0, context=isl + osl / 2, prefill_requests=0.0,
                      prefill_len=isl)
        mixed = dataclasses.replace(decode, prefill_requests=1.0)
        prefill = Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=1.0, prefill_len=isl)
        expect = {"decode": (1 - rho) * _model_step(chip, KT8, PARAMS, m, decode)
                  + rho * _model_step(chip, KT8, PARAMS, m, mixed),
                  "prefill": _model_step(chip, KT8, PARAMS, m, prefill)}
        for phase in ("decode", "prefill"):
            d = parts[phase]
            assert all(isinstance(v, float) and v >= 0.0 for v in d.values()), d
            s = d["compute_s"] + d["memory_s"] + d["network_s"] + d["overhead_s"] + d["power_s"]
            assert s == pytest.approx(d["total_s"], rel=1e-5)
            assert d["total_s"] == pytest.approx(expect[phase], rel=1e-5)
        out = point(chip, KT8, PARAMS, sc, m, b)
        assert parts["decode"]["total_s"] == pytest.approx(out["tpot_s"], rel=1e-5)
        assert parts["prefill"]["total_s"] + parts["decode"]["total_s"] == pytest.approx(out["ttft_s"], rel=1e-5)
        if m.pp > 1:
            assert parts["decode"]["network_s"] > 0.0
        if chip.power_rating_w == 200.0:  # streaming 30 TB/s at 31 pJ/B alone draws ~900 W
            assert out["clock_factor"] < 1.0 and parts["decode"]["power_s"] > 0.0


def test_time_attribution_with_mtp_drafts_is_the_decode_iteration():
    sc = scenario(draft_tokens=2, acceptance_rate=0.7)
    parts = time_attribution(preset("h100_sxm"), KT8, PARAMS, sc, Mapping(), 16.0)["decode"]
    out = point(preset("h100_sxm"), KT8, PARAMS, sc, Mapping(), 16.0)
    assert parts["total_s"] == pytest.approx(out["tpot_s"] * sc.tokens_per_step, rel=1e-5)
    s = parts["compute_s"] + parts["memory_s"] + parts["network_s"] + parts["overhead_s"] + parts["power_s"]
    assert s == pytest.approx(parts["total_s"], rel=1e-5)


def test_memory_bound_decode_and_compute_bound_prefill():
    sc = scenario("inferencex_8k1k")
    parts = time_attribution(preset("h100_sxm"), KT16, PARAMS, sc, Mapping(), 1.0)
    d, p = parts["decode"], parts["prefill"]
    assert d["memory_s"] > 0.7 * d["total_s"] and d["compute_s"] < 0.1 * d["total_s"]
    assert p["compute_s"] > 0.7 * p["total_s"]  # ~7.4k tokens x 2 x 8B FLOPs


# ---------------------------------------------------------------------------------------------- roofline
def test_roofline_points():
    chip, m, b = preset("h100_sxm"), Mapping(tp=2), 32.0
    r = roofline_points(chip, KT8, PARAMS, SC, m, b)
    assert r["peak_flops_per_s"] == pytest.approx(1.979e15, rel=1e-6)  # FP8 dominates an FP8 Llama
    assert r["hbm_bandwidth_bytes_per_s"] == pytest.approx(3.35e12, rel=1e-6)
    assert {q["phase"] for q in r["points"]} == {"decode", "prefill"}
    for q in r["points"]:
        assert q["flops"] > 0 or q["bytes"] > 0
        if q["bytes"] > 0:
            assert q["intensity_flop_per_byte"] == pytest.approx(q["flops"] / q["bytes"], rel=1e-9)
        assert q["achieved_flops_per_s"] == pytest.approx(q["flops"] / q["time_s"], rel=1e-9)
        assert q["achieved_flops_per_s"] <= r["peak_flops_per_s"]
    # the FFN: 2 x 3 h F FLOPs per token per layer over the decode step's B tokens, split over tp = 2
    tokens = b
    mlp = next(q for q in r["points"] if q["kernel"] == "mlp" and q["phase"] == "decode")
    assert mlp["flops"] == pytest.approx(2 * 3 * H * F * L * tokens / 2, rel=1e-3)
    assert mlp["bytes"] >= 3 * H * F * L / 2  # at least its FP8 weights
    # the per-row figures add up to the step's totals
    w = Work(decode_tokens=b, decode_queries=1.0, context=SC.mean_isl_tokens + SC.mean_osl_tokens / 2,
             prefill_requests=0.0, prefill_len=SC.mean_isl_tokens)
    out = kernel_times(chip, KT8, PARAMS, m, w)
    dec = [q for q in r["points"] if q["phase"] == "decode"]
    assert sum(q["flops"] for q in dec) == pytest.approx(float(np.sum(out["flops_by_dtype"])), rel=1e-5)
    assert sum(q["bytes"] for q in dec) == pytest.approx(float(out["hbm_bytes"] + out["sram_bytes"]), rel=1e-5)
