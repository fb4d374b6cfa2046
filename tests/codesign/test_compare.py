"""`python -m codesign.compare`: presets and designs of a stored sweep side by side on the same workloads."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arch_space.chip import NUMERIC_FIELDS
from arch_space.errors import ConfigError
from codesign import compare
from codesign.cli import _compose
from codesign.schema import load_hardware_preset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "codesign.compare", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _sweep_dir(tmp_path, preset="gb200", design_id="abcdef0123456789"):
    """A stored run with one candidate whose chip_* columns are those of ``preset``."""
    chip = load_hardware_preset(preset, "test")
    row = {"design_id": design_id, "name": "gen2-abcdef01", "kind": "candidate", "generation": "gen2",
           "workload": "llama3_8b", "feasible": True, "reason": "", "mapping": "tp1", "chip_cost_usd": 12345.0}
    row |= {f"chip_{f}": float(getattr(chip, f)) for f in NUMERIC_FIELDS}
    d = tmp_path / "run"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([row]), d / "results.parquet")
    return d


def test_compare_rebuilds_a_sweep_design_and_matches_its_preset(tmp_path):
    run = _sweep_dir(tmp_path)
    # serving=default has no vendor families: the preset (NVIDIA's set under serving=calibrated) and the rebuilt
    # candidate (the shared set) are then evaluated with the same parameters
    cfg = _compose(["designs=[gb200,abcdef01]", "workloads=[llama3_8b]", "scenario=inferencex_1k1k",
                    f"sweep_dir={run}", f"output={tmp_path / 'out'}", "targets=[50,100]", "serving=default"],
                   "compare")
    args = compare._validate(cfg)
    assert [d[0] for d in args["designs"]] == ["gb200", "abcdef0123456789"]  # unique prefix resolved
    result = compare.run(args)
    assert result["figure"].read_bytes()[:8] == PNG_MAGIC and result["results"].exists()
    vals = {(v["design"], v["target_tok_s_user"]): v for v in result["values"]}
    for t in (50.0, 100.0):
        a, b = vals[("gb200", t)], vals[("abcdef0123456789", t)]
        assert a["tok_s_per_chip"] > 0
        assert b["tok_s_per_chip"] == pytest.approx(a["tok_s_per_chip"])  # same chip, same frontier
        assert b["tok_s_per_kw"] == pytest.approx(a["tok_s_per_kw"])
    text = compare.format_tables(result["values"], args, result["reasons"])
    assert "gb200" in text and "abcdef0123456789 (sweep)" in text and "tok/s/chip @50" in text
    out = json.loads(compare.to_json(args, result))
    assert {v["design"] for v in out["values"]} == {"gb200", "abcdef0123456789"}
    assert out["figure"].endswith("frontier.png") and out["designs"][1]["source"] == "sweep"


def test_compare_rejects_unknown_designs_and_workloads(tmp_path):
    base = ["workloads=[llama3_8b]", "scenario=inferencex_1k1k"]
    with pytest.raises(ConfigError, match=r"designs\[2\].*unknown hardware preset 'nope'"):
        compare._validate(_compose(["designs=[gb200,b200,nope]", *base], "compare"))
    with pytest.raises(ConfigError, match=r"designs\[1\].*unknown design 'zzzzzzzz'"):
        compare._validate(_compose(["designs=[gb200,zzzzzzzz]", f"sweep_dir={_sweep_dir(tmp_path)}", *base],
                                   "compare"))
    with pytest.raises(ConfigError, match=r"workloads\[0\].*unknown workload preset 'gpt5'"):
        compare._validate(_compose(["designs=[gb200]", "workloads=[gpt5]"], "compare"))
    with pytest.raises(ConfigError, match=r"designs\[1\].*listed twice"):
        compare._validate(_compose(["designs=[gb200,gb200]", *base], "compare"))


def test_compare_command_bad_design_is_one_line(tmp_path):
    """As the user sees it: one line on stderr naming the entry, exit status 2."""
    proc = _run("designs=[gb200,b200,no_such_chip]", "workloads=[llama3_8b]", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("codesign.compare: error: designs[2]: unknown hardware preset "
                                                   "'no_such_chip'"), proc.stderr
    with pytest.raises(ConfigError, match="sweep: no results.parquet"):
        compare._validate(_compose(["designs=[gb200]", "workloads=[llama3_8b]", f"sweep_dir={tmp_path / 'x'}"],
                                   "compare"))


@pytest.mark.slow
def test_compare_command_prints_both_presets_and_writes_a_png(tmp_path):
    proc = _run("designs=[gb200,jalapeno_gen1]", "workloads=[llama3_8b]", "scenario=inferencex_1k1k", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| gb200 |" in proc.stdout and "| jalapeno_gen1 |" in proc.stdout and "llama3_8b" in proc.stdout
    png = tmp_path / "compare" / "frontier.png"  # default output: compare/ in the working directory
    assert png.read_bytes()[:8] == PNG_MAGIC and str(png) in proc.stdout
