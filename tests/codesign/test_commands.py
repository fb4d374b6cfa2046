"""The describe, predict and bench commands as a user runs them: output, and one-line errors."""

import json
import subprocess
import sys

import pytest


def run(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout)


def test_describe_prints_one_json_object_with_the_required_fields():
    proc = run("codesign.describe", "workload=llama3_8b", "precision=fp8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    for key in ("total_params", "active_params_per_token", "weight_bytes", "kv_cache_bytes_per_token",
                "decode_flops_per_token", "kernels"):
        assert key in out
    assert out["kv_cache_bytes_per_token"] == 32 * 2 * 8 * 128 * 1  # FP8 KV: 64 KiB / 2
    # traced decode FLOPs agree with 2 x active + attention (the traced graph and the closed form are independent)
    assert out["decode_flops_per_token"] == pytest.approx(out["decode_flops_per_token_closed_form"], rel=0.05)
    assert any(k["name"] == "layer_0/attention" for k in out["kernels"])


def test_describe_from_a_hugging_face_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_layer": 12}))
    proc = run("codesign.describe", f"hf_config={cfg}")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "architectures" in proc.stderr and "GPT2LMHeadModel" in proc.stderr


@pytest.mark.parametrize("module,argv,expect", [
    ("codesign.describe", ["workload=nope"], "workload: unknown preset 'nope'"),
    ("codesign.predict", ["hardware=nope"], "hardware: unknown preset 'nope'"),
    ("codesign.predict", ["format=xml"], "format: must be table or json, got 'xml'"),
    ("codesign.bench", ["suite=gpus"], "suite: must be one of serving, sweeps, validate, got 'gpus'"),
    ("codesign.predict", ["serving.unmeasured_family=intel"],
     "serving.unmeasured_family: no fitted family 'intel' (fitted: amd, nvidia; null: the shared set)"),
    ("codesign.bench", ["scenario=inferencex_8k1k_mtp"],
     "scenario.draft_tokens: gpt_oss_120b has no MTP head for speculative decoding"),
    ("codesign.describe", ["context_tokens=1e12"], "context_tokens: gpt_oss_120b attends over at most 131072"),
    ("codesign.predict", ["scenario.isl_tokens=1000000"], "scenario: the scenario 'inferencex_1k1k' reaches 1001024"),
    # a bare string or number where a list goes was once iterated character by character (or a TypeError)
    ("codesign.predict", ["mappings=tp4"], "mappings: expected a list of mapping names, got 'tp4'"),
    ("codesign.predict", ["mappings=5"], "mappings: expected a list of mapping names, got 5"),
    ("codesign.predict", ["mappings=[tp4,tp4]"], "mappings[1]: 'tp4' is listed twice"),
    ("codesign.calibrate", ["fit=gemm_efficiency_max"], "fit: expected a list of serving parameter names, got"),
    # an empty output once meant conf/serving/calibrated.yaml, a tracked file, silently
    ("codesign.calibrate", ["output="], "output: expected a file path, got ''"),
    # output paths are checked before the work, not after it
    ("codesign.validate", ["output=/"], "output: '/' is an existing directory"),
    ("codesign.validate", [f"output={__file__}/out.csv"], f"lies under '{__file__}', which is a file"),
    ("codesign.validate", ["reference=5"], "reference: expected a path to a reference CSV, or null, got 5"),
])
def test_commands_reject_bad_input_in_one_line(module, argv, expect):
    proc = run(module, *argv)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"{module}: error: " + proc.stderr.split("error: ", 1)[1].strip()]
    assert expect in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_predict_prints_the_frontier_table_and_json():
    proc = run("codesign.predict", "hardware=h200_sxm", "workload=llama3_8b", "precision=fp8",
               "scenario=inferencex_1k1k", "format=json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    front = out["frontier"]
    assert front, "a frontier"
    xs = [p["interactivity_tok_s_user"] for p in front]
    ys = [p["total_tok_s_per_chip"] for p in front]
    assert xs == sorted(xs) and ys == sorted(ys, reverse=True)  # a Pareto frontier: faster users, fewer tokens
    for p in front:
        assert p["e2e_s"] == pytest.approx(p["ttft_s"] + (1024 * 0.9 - 1) * p["tpot_s"], rel=1e-4)
        assert p["interactivity_tok_s_user"] == pytest.approx(1 / p["tpot_s"], rel=1e-5)
    table = run("codesign.predict", "hardware=h200_sxm", "workload=llama3_8b", "precision=fp8")
    assert table.returncode == 0 and "tok/s/user" in table.stdout and "Pareto frontier" in table.stdout


@pytest.mark.slow
def test_bench_prints_name_value_lines():
    proc = run("codesign.bench", "suite=serving", "designs=200", "loop_designs=3", "repeats=1",
               "workload=llama3_8b", "precision=fp8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(ln.split(": ", 1) for ln in proc.stdout.strip().splitlines())
    for key in ("vectorized_evals_per_s_per_core", "loop_evals_per_s_per_core", "speedup"):
        assert float(lines[key]) > 0


@pytest.mark.slow
def test_bench_sweeps_prints_the_issue_figures():
    proc = run("codesign.bench", "suite=sweeps", "scaling_designs=1024", "sweep_designs=2048", "batch_size=512",
               "workload=llama3_8b", "precision=fp8", "scenario=inferencex_1k1k")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(ln.split(": ", 1) for ln in proc.stdout.strip().splitlines())
    for key in ("evals_per_s_1_worker", "evals_per_s_2_workers", "scaling", "sweep_1m_wall_s",
                "sweep_1m_peak_rss_bytes"):
        assert float(lines[key]) > 0, key
    assert int(lines["sweep_1m_designs"]) == 2048 and int(lines["sweep_1m_rows_stored"]) > 0


@pytest.mark.slow
def test_bench_validate_prints_rows_and_times():
    proc = run("codesign.bench", "suite=validate", "validate_rows=3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(ln.split(": ", 1) for ln in proc.stdout.strip().splitlines())
    assert int(lines["rows"]) == 3 and int(lines["models"]) == 3 and int(lines["kernel_tables"]) == 3
    assert int(lines["predicted"]) > 0
    for key in ("trace_s", "rows_s", "total_s"):
        assert float(lines[key]) > 0, key


def test_bench_sweeps_needs_a_sampled_space():
    proc = run("codesign.bench", "suite=sweeps", "space=smoke")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("codesign.bench: error: space: suite=sweeps samples")
