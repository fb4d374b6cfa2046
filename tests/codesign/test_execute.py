"""``python -m codesign.execute``: the model's steps run on the CPU next to the serving model's prediction.

The run tests only that both numbers exist (positive, finite) for decode and prefill, per step and per kernel class;
the agreement itself is printed, not asserted (timings on shared CI machines are noisy).
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

TINY = ["workload=llama3_8b", "layers=1", "vocab=1024", "batch=2", "context=64", "prefill_tokens=32", "repeats=2",
        "warmup=1", "bench.matmul_size=512", "bench.repeats=2"]


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "codesign.execute", *args], capture_output=True, text=True,
                          timeout=timeout)


def _check_steps(out):
    assert [s["phase"] for s in out["steps"]] == ["decode", "prefill"]
    for s in out["steps"]:
        for key in ("measured_s", "predicted_s"):
            assert math.isfinite(s[key]) and s[key] > 0, (s["phase"], key, s[key])
        for key in ("gemm", "attention", "other"):
            for side in ("classes_measured_s", "classes_predicted_s"):
                assert math.isfinite(s[side][key]) and s[side][key] > 0, (s["phase"], side, key)
        print(f"{s['phase']}: measured {s['measured_s'] * 1e3:.2f} ms, predicted {s['predicted_s'] * 1e3:.2f} ms, "
              f"predicted/measured {s['ratio']:.2f}")


def test_execute_reports_measured_and_predicted_decode_and_prefill():
    proc = run(*TINY, "format=json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["layers"] == 1 and out["vocab"] == 1024 and out["exec_dtype"] == "float32"
    assert out["precision"] == "fp32"
    _check_steps(out)
    chip = out["chip"]
    assert chip["bf16_flops_per_s"] == out["microbenchmarks"]["matmul_flops_per_s"] > 0
    assert chip["hbm_bandwidth_bytes_per_s"] == out["microbenchmarks"]["stream_bytes_per_s"] > 0
    assert chip["sram_explicit_fraction"] == 0.0 and chip["scaleup_domain_chips"] == 1
    assert out["steps"][0]["serving_params"]["memory_efficiency_max"] == 1.0  # the rates are achieved ones
    assert set(out["steps"][0]["predicted_s_by_params"]) == {"phase", "run", "rates", "config"}
    fits = out["gemm_fits"]
    assert list(fits) == ["decode B=2", "prefill", "run"]
    for s, key, own in zip(out["steps"], ("decode B=2", "prefill"), (2, 32)):
        # each step predicted from the weight stream and the GEMM rows timed in its own rounds, its curve anchored
        # at its own row count
        assert s["stream_bytes_per_s"] > 0 and fits[key]["stream_bytes_per_s"] == s["stream_bytes_per_s"]
        assert fits[key]["anchor"] == own and own in s["gemm_sweep"]["rows"] == fits[key]["rows"]
        assert len(s["gemm_sweep"]["seconds"]) == len(s["gemm_sweep"]["rows"]) >= 2
    assert "stream_bytes_per_s" not in fits["run"]  # the micro-benchmarks' whole sweep
    # the device's depth curve, measured and fitted, reported beside the config's value: phase mode predicts with
    # it, the row curve's maximum divided by the depth factor at the sweep's K
    depth, dfit = out["microbenchmarks"]["depth_sweep"], out["depth_fit"]
    assert len(depth["k"]) == len(depth["seconds"]) == len(dfit["predicted_over_measured"]) >= 5
    assert all(t > 0 for t in depth["seconds"]) and dfit["gemm_k_half"] >= 0 and dfit["rate_inf_flops_per_s"] > 0
    assert dfit["config_gemm_k_half"] == 256.0  # conf/serving/default.yaml's start
    sp, k_ref = out["steps"][0]["serving_params"], out["microbenchmarks"]["gemm_sweep"]["k"]
    assert sp["gemm_k_half"] == dfit["gemm_k_half"]
    assert sp["gemm_efficiency_max"] * k_ref / (k_ref + dfit["gemm_k_half"]) == pytest.approx(
        fits["decode B=2"]["gemm_efficiency_max"], rel=1e-12)
    # the device's attention curve, swept at the largest decode step's shape and fitted, beside the config's value
    # (reported only: every mode predicts attention with the config's curve)
    att, afit = out["attention_sweep"], out["attention_fit"]
    assert att["batch"] == 2 and att["context"] == 64 and len(att["seconds"]) == len(att["rows"]) >= 5
    assert len(afit["predicted_over_measured"]) == len(afit["share_of_matmul_rate"]) == len(att["rows"])
    assert 0 < afit["attention_efficiency_max"] <= 1.5 and afit["attention_rows_half"] >= 0
    assert afit["config_attention_rows_half"] == 16.0
    assert all(s["serving_params"]["attention_rows_half"] == 16.0 for s in out["steps"])
    for s in out["steps"]:  # the step's own call overhead, no less than a scalar call's, priced as its overhead
        assert out["microbenchmarks"]["dispatch_s"] <= s["serving_params"]["step_overhead_s"] < s["measured_s"]
        assert s["serving_params"]["step_overhead_s"] == max(s["dispatch_s"], out["microbenchmarks"]["dispatch_s"])


@pytest.mark.slow
def test_execute_table_on_a_tiny_moe():
    proc = run("workload=qwen3_30b_a3b", "layers=1", "vocab=1024", "experts=16", "batch=2", "context=32",
               "prefill_tokens=32", "repeats=2", "warmup=0", "bench.matmul_size=512", "bench.repeats=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "16 experts, moe_impl grouped" in lines[0]
    assert any(ln.startswith("decode B=2 C=32") and "step" in ln for ln in lines)
    assert any("MoE experts" in ln for ln in lines) and any(ln.startswith("prefill T=32") for ln in lines)
    print(proc.stdout)


def test_execute_rejects_bad_input_in_one_line():
    proc = run("workload=llama3_8b", "layers=0", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == "codesign.execute: error: layers: must be > 0, got 0"
    assert proc.stdout == ""


@pytest.mark.parametrize("argv,expect", [
    (["layers=33"], "layers: llama3_8b has 32 layers, got 33"),
    (["layers=two"], "layers: expected a number, got 'two'"),
    (["vocab=200000"], "vocab: caps the vocabulary: at most 128256 for llama3_8b, got 200000"),
    (["experts=4"], "experts: llama3_8b has no routed experts, got 4"),
    (["workload=qwen3_30b_a3b", "experts=4"], "experts: must be between experts_per_token (8) and 128, got 4"),
    (["batch=[1,-2]"], "batch[1]: must be > 0, got -2"),
    (["context=0"], "context: must be > 0, got 0"),
    (["exec_dtype=fp16"], "exec_dtype: must be one of auto, float32, bfloat16, got 'fp16'"),
    (["params=tuned"], "params: must be one of phase, run, rates, config, got 'tuned'"),
    (["stat=mean"], "stat: must be one of median, min, got 'mean'"),
    (["serving.gemm_rows_half=-1"], "serving.gemm_rows_half: must be > 0, got -1"),
    (["+bench.size=3"], "bench.size: unknown key"),
    (["+warp=1"], "warp: unknown key"),
    (["workload=nope"], "workload: unknown preset 'nope'"),
])
def test_execute_validates_its_config(argv, expect):
    from arch_space.errors import ConfigError
    from codesign.cli import precheck
    from codesign.execute import _validate

    with pytest.raises(ConfigError) as err:
        precheck(argv, _validate, config_name="execute")
    assert "\n" not in str(err.value) and expect in str(err.value), str(err.value)
