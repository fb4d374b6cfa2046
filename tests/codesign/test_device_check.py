"""``.device/check.sh``, the prepared check for a lent GPU machine, run here at its small size (CHECK_SMALL=1) so
that it cannot rot between the sessions that have a GPU: .device/prepare.sh vendors hydra / omegaconf / antlr4 (the
device image lacks them) and the script runs ``codesign.execute`` on three workloads, one JSON each."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_device_check_runs_every_workload_and_reports_measured_and_predicted(tmp_path):
    venv = ROOT / ".venv"
    if not (venv / "bin" / "python").exists():
        pytest.skip("prepare.sh vendors from the checkout's .venv, which this environment does not have")
    prep = subprocess.run(["bash", str(ROOT / ".device" / "prepare.sh")], capture_output=True, text=True, timeout=120)
    assert prep.returncode == 0, prep.stderr
    assert (ROOT / ".device" / "vendor" / "hydra").is_dir()
    env = dict(os.environ, CHECK_SMALL="1", OUT=str(tmp_path), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / ".device" / "check.sh")], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "jax" in (tmp_path / "device.txt").read_text()  # the device's identity, for the record
    for name in ("llama3_8b", "gpt_oss_20b", "deepseek_r1"):
        out = json.loads((tmp_path / f"{name}.json").read_text())
        assert out["workload"] == name and [s["phase"] for s in out["steps"]] == ["decode", "decode", "prefill"]
        for s in out["steps"]:
            assert math.isfinite(s["ratio"]) and s["measured_s"] > 0 and s["predicted_s"] > 0
        assert f"{name} (" in proc.stdout  # the summary line of each workload
    assert proc.stdout.count("attention sweep (the model code through XLA") == 3  # the device's attention curve
