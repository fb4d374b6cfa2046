"""Bad input to `codesign.report` and `codesign.compare` fails early in one line, and their output appears whole or
not at all: a stored run's study.json settings, the output location, the chip figures of a sweep design."""

import json
import math
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_compare import _sweep_dir
from test_recommend import synthetic_table
from test_report import PNG_MAGIC, run_dir, synthetic_meta  # noqa: F401 (run_dir: fixture)

from arch_space.errors import ConfigError
from codesign import compare, report
from codesign.cli import _compose
from codesign.recommend import recommend_from_meta, settings_from_meta
from codesign.report_output import check_output, write_files

WORKLOADS = ("A", "B")


def _leftovers(d):
    """Temporary files or directories of an interrupted write."""
    return [p for p in d.rglob(".*") if p.name.endswith(".tmp")] if d.exists() else []


# ---------------------------------------------------------------------------------------------- study.json settings
BAD_META = [
    ({"targets": ["abc"]}, "study.json: targets[0]", "expected a number, got 'abc'"),
    ({"targets": 5}, "study.json: targets", "got 5"),
    ({"targets": []}, "study.json: targets", "needs at least one value"),
    ({"targets": [50, -1]}, "study.json: targets[1]", "must be > 0, got -1"),
    ({"top_k": "x"}, "study.json: top_k", "expected a number, got 'x'"),
    ({"top_k": -3}, "study.json: top_k", "must be > 0, got -3"),
    ({"top_k": 2.5}, "study.json: top_k", "whole number, got 2.5"),
    ({"config": "x"}, "study.json: config", "expected a mapping (the study's config), got 'x'"),
    ({"config": {"report": [1]}}, "study.json: config.report", "expected a mapping, got [1]"),
    ({"config": {"report": {"dpi": 0}}}, "study.json: config.report.dpi", "must be > 0, got 0"),
    ({"mix": "gpt_oss_20b"}, "study.json: mix", "got 'gpt_oss_20b'"),
    ({"mix": {"no_such_workload": 1}}, "study.json: mix", "workload 'no_such_workload' has no rows in "
                                                          "results.parquet (workloads there: A, B)"),
    ({"mix": {"A": 1, "B": -1}}, "study.json: mix.B", "must be > 0, got -1"),
    ({"mix": {"A": "heavy"}}, "study.json: mix.A", "expected a number, got 'heavy'"),
    ({"agent_chain_steps": 0}, "study.json: agent_chain_steps", "must be > 0, got 0"),
    ({"headline_target": "x"}, "study.json: headline_target", "expected a number, got 'x'"),
    ({"objective": 3}, "study.json: objective", "got 3"),
]


@pytest.mark.parametrize("change,path,detail", BAD_META, ids=[c[1] + "=" + repr(c[0]) for c in BAD_META])
def test_bad_study_json_settings_name_the_field_and_value(change, path, detail):
    meta = synthetic_meta() | change
    with pytest.raises(ConfigError) as err:
        settings_from_meta(meta, WORKLOADS)
    assert err.value.path == path and detail in err.value.detail


def test_config_fallbacks_are_checked_too():
    base = {k: v for k, v in synthetic_meta().items() if k not in ("targets", "mix", "top_k", "objective")}
    rep = base["config"]["report"]
    with pytest.raises(ConfigError, match=r"^study.json: config.report.interactivity_targets_tok_s_user\[0\]: "):
        settings_from_meta(base | {"config": {"report": rep | {"interactivity_targets_tok_s_user": [None]}}})
    with pytest.raises(ConfigError, match=r"^study.json: config.report.top_k: must be > 0, got 0"):
        settings_from_meta(base | {"config": {"report": rep | {"top_k": 0}}})
    # the study config's mix is a list of workload names with mix_weights (null: equal)
    s = settings_from_meta(base | {"config": {"report": rep, "mix": ["A", "B"], "mix_weights": [3, 1]}}, WORKLOADS)
    assert s["mix"] == {"A": 3.0, "B": 1.0} and s["top_k"] == 3 and s["targets"] == (50.0, 100.0, 300.0)
    assert settings_from_meta(base | {"config": {"mix": ["A", "B"]}})["mix"] == {"A": 1.0, "B": 1.0}
    with pytest.raises(ConfigError, match=r"^study.json: config.mix_weights\[1\]: must be > 0"):
        settings_from_meta(base | {"config": {"mix": ["A", "B"], "mix_weights": [1, 0]}})
    with pytest.raises(ConfigError, match=r"^study.json: config.mix: workload 'C' has no rows"):
        settings_from_meta(base | {"config": {"mix": ["A", "C"]}}, WORKLOADS)


def test_good_settings_are_unchanged():
    s = settings_from_meta(synthetic_meta(), WORKLOADS)
    assert s == {"objective": "total_tok_s_per_kw", "targets": (50.0, 100.0, 300.0), "top_k": 3,
                 "mix": {"A": 0.5, "B": 0.5}, "chain_steps": 6, "chain_in_e2e": False, "headline_target": None,
                 "dpi": 60}
    assert settings_from_meta({}) == {"objective": "total_tok_s_per_kw", "targets": (50.0, 100.0, 200.0), "top_k": 5,
                                      "mix": None, "chain_steps": 1, "chain_in_e2e": False, "headline_target": None,
                                      "dpi": 110}
    # recommend_from_meta keeps leaving out (with a note) mix workloads without rows: only the report command,
    # which knows the run's workloads, refuses them
    rec = recommend_from_meta(synthetic_table(), {"mix": {"A": 1, "gone": 1}})
    assert rec.mix == {"A": 1.0} and any("gone" in n for n in rec.notes)


def _corrupt(run_dir, **change):  # noqa: F811
    meta = json.loads((run_dir / "study.json").read_text()) | change
    (run_dir / "study.json").write_text(json.dumps(meta))


def test_report_checks_study_json_before_any_work(run_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(report, "make_figures", lambda *a, **k: pytest.fail("rendered before checking"))
    _corrupt(run_dir, mix={"no_such_workload": 1})
    with pytest.raises(ConfigError, match=r"^study.json: mix: workload 'no_such_workload' has no rows"):
        report._validate({"sweep_dir": str(run_dir), "output": None, "dpi": None})
    with pytest.raises(ConfigError, match=r"^study.json: mix: workload 'no_such_workload'"):
        report.regenerate(run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (run_dir / "report.html").exists()


def _report_cmd(*args):
    return subprocess.run([sys.executable, "-m", "codesign.report", *args], capture_output=True, text=True,
                          timeout=120)


def test_report_command_bad_study_json_is_one_line(run_dir):  # noqa: F811
    _corrupt(run_dir, targets=["abc"])
    proc = _report_cmd(f"sweep={run_dir}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == ["codesign.report: error: study.json: targets[0]: expected a number, "
                                                "got 'abc'"]


# ---------------------------------------------------------------------------------------------- report output
def test_report_output_problems_are_caught_up_front(run_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(report, "make_figures", lambda *a, **k: pytest.fail("rendered before checking"))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    busy = tmp_path / "busy"
    (busy / "summary.md").mkdir(parents=True)
    figs_file = tmp_path / "figs_file"
    figs_file.mkdir()
    (figs_file / "figures").write_text("not a directory")
    cases = [(a_file, "is an existing file, not a directory"),
             (a_file / "sub", "cannot create the directory"),
             (busy, "summary.md' is a directory, but the output writes the file summary.md there"),
             (figs_file, "figures' is an existing file, but the output needs a directory there")]
    for out, expect in cases:
        with pytest.raises(ConfigError, match="^output: ") as err:
            report._validate({"sweep_dir": str(run_dir), "output": str(out), "dpi": None})
        assert expect in err.value.detail
        with pytest.raises(ConfigError, match="^output: "):
            report.regenerate(run_dir, out)
    assert a_file.read_text() == "keep me"
    assert sorted(p.name for p in busy.iterdir()) == ["summary.md"] and not _leftovers(busy)
    assert sorted(p.name for p in figs_file.iterdir()) == ["figures"]
    # the default output is the run directory itself
    (run_dir / "report.html").mkdir()
    with pytest.raises(ConfigError, match=r"^output: .*report.html' is a directory"):
        report._validate({"sweep_dir": str(run_dir), "output": None, "dpi": None})


def test_report_command_output_an_existing_file_is_one_line(run_dir, tmp_path):  # noqa: F811
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    proc = _report_cmd(f"sweep={run_dir}", f"output={a_file}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"codesign.report: error: output: {str(a_file)!r} is an existing "
                                                f"file, not a directory"]


def test_report_files_appear_together_or_not_at_all(run_dir, tmp_path, monkeypatch):  # noqa: F811
    import codesign.report_output as ro

    out = tmp_path / "out"
    paths = report.regenerate(run_dir, out, dpi=40)  # a fresh directory: built aside, renamed into place
    assert paths["report.html"] == out / "report.html" and paths["roofline"] == out / "figures" / "roofline.png"
    assert paths["roofline"].read_bytes()[:8] == PNG_MAGIC and not _leftovers(tmp_path)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # a failure while moving the files into place: the report before it stays as it was, nothing half-written
    real = ro.os.replace

    def replace(src, dst, *a, **k):  # fails for the report's files only
        if str(dst).startswith(str(out)):
            raise OSError(28, "No space left on device")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(ro.os, "replace", replace)
    with pytest.raises(ConfigError, match=r"^output: cannot write .*frontier_per_chip.png': No space left on device"):
        report.regenerate(run_dir, out, dpi=40)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before and not _leftovers(tmp_path)
    monkeypatch.undo()
    # into the run directory itself (the default): staged inside it, then moved into place
    paths = report.regenerate(run_dir, None, dpi=40)
    assert paths["summary.md"] == run_dir / "summary.md" and (run_dir / "results.parquet").exists()
    assert (run_dir / "figures" / "design_space.png").read_bytes()[:8] == PNG_MAGIC and not _leftovers(run_dir)


def test_write_files_leaves_nothing_behind_on_failure(tmp_path):
    def boom(path):
        path.write_bytes(b"half")
        raise OSError(5, "Input/output error")

    out = tmp_path / "new"
    with pytest.raises(ConfigError, match=r"^output: cannot write .*b.bin': Input/output error"):
        write_files(out, {"a.txt": b"a", "sub/x.png": b"x", "b.bin": boom})
    assert not out.exists() and list(tmp_path.iterdir()) == []
    out.mkdir()
    (out / "a.txt").write_text("old")
    with pytest.raises(ConfigError):
        write_files(out, {"a.txt": b"a", "b.bin": boom})
    assert [p.name for p in out.iterdir()] == ["a.txt"] and (out / "a.txt").read_text() == "old"
    with pytest.raises(ValueError, match="not output"):  # any other failure: same clean-up, error unchanged
        write_files(out, {"a.txt": b"a", "b.bin": lambda p: (_ for _ in ()).throw(ValueError("not output"))})
    assert [p.name for p in out.iterdir()] == ["a.txt"]
    assert write_files(out, {"a.txt": b"new", "sub/x.png": b"x"}) == {"a.txt": out / "a.txt",
                                                                         "sub/x.png": out / "sub" / "x.png"}
    assert (out / "a.txt").read_text() == "new" and sorted(p.name for p in out.iterdir()) == ["a.txt", "sub"]
    assert check_output(out, ["a.txt"]) == out


# ---------------------------------------------------------------------------------------------- compare output
def _compare_cfg(out, *extra):
    return _compose(["designs=[gb200]", "workloads=[llama3_8b]", "scenario=inferencex_1k1k", f"output={out}",
                     "targets=[50]", "serving=default", *extra], "compare")


def test_compare_output_problems_are_caught_before_the_modelling(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "evaluate", lambda *a, **k: pytest.fail("modelled before checking the output"))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    busy = tmp_path / "busy"
    (busy / "results.parquet").mkdir(parents=True)
    for out, expect in ((a_file, "is an existing file, not a directory"),
                        (busy, "results.parquet' is a directory, but the output writes the file results.parquet"),
                        (a_file / "sub", "is not a directory")):
        with pytest.raises(ConfigError, match="^output: ") as err:
            compare._validate(_compare_cfg(out))
        assert expect in err.value.detail
    # run() checks again (the location may have changed since the command line was checked)
    args = compare._validate(_compare_cfg(tmp_path / "later"))
    (tmp_path / "later").write_text("now a file")
    with pytest.raises(ConfigError, match="^output: .*is an existing file"):
        compare.run(args)
    assert a_file.read_text() == "keep me" and sorted(p.name for p in busy.iterdir()) == ["results.parquet"]


def test_compare_writes_both_files_or_neither(tmp_path, monkeypatch):
    import sweeps.store

    args = compare._validate(_compare_cfg(tmp_path / "out"))

    def disk_full(table, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweeps.store, "atomic_write_table", disk_full)
    with pytest.raises(ConfigError, match=r"^output: cannot write .*results.parquet': No space left on device"):
        compare.run(args)
    assert list(tmp_path.iterdir()) == []  # no frontier.png without its results
    monkeypatch.undo()
    result = compare.run(args)
    assert result["figure"] == (tmp_path / "out" / "frontier.png").resolve()
    assert result["figure"].read_bytes()[:8] == PNG_MAGIC and pq.read_table(result["results"]).num_rows > 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["frontier.png", "results.parquet"]


# ---------------------------------------------------------------------------------------------- sweep chip figures
def _with_row(run, **change):
    table = pq.read_table(run / "results.parquet")
    row = table.to_pylist()[0] | change
    pq.write_table(pa.Table.from_pylist([row], schema=table.schema), run / "results.parquet")
    return run


@pytest.mark.parametrize("column,value,detail", [
    ("chip_hbm_bandwidth_bytes_per_s", -1.0, "must be > 0, got -1.0"),
    ("chip_power_rating_w", math.nan, "must be finite, got nan"),
    ("chip_power_rating_w", None, "is required (got null)"),
    ("chip_hbm_capacity_bytes", 0.0, "must be > 0, got 0.0"),
    ("chip_die_area_m2", math.inf, "must be finite, got inf"),
    ("chip_idle_power_w", 5000.0, "must be below power_rating_w"),
    ("chip_scaleup_domain_chips", 7.5, "must be a whole number, got 7.5"),
    ("chip_sram_explicit_fraction", 1.5, "must be <= 1, got 1.5"),
])
def test_compare_checks_a_sweep_designs_chip_figures(tmp_path, column, value, detail):
    run = _with_row(_sweep_dir(tmp_path), **{column: value})
    with pytest.raises(ConfigError) as err:
        compare._validate(_compose(["designs=[gb200,abcdef01]", "workloads=[llama3_8b]", f"sweep_dir={run}"],
                                   "compare"))
    assert err.value.path == "sweep"
    assert err.value.detail.startswith(f"design abcdef0123456789 in {str(run / 'results.parquet')!r}: {column}: ")
    assert detail in err.value.detail


def test_sweep_chips_keep_unknown_figures_and_infeasible_designs(tmp_path):
    row = pq.read_table(_sweep_dir(tmp_path) / "results.parquet").to_pylist()[0]
    chip = compare._sweep_chip(row | {"chip_die_area_m2": 0.0, "chip_int8_flops_per_s": None})
    assert chip.die_area_m2 == 0.0 and chip.int8_flops_per_s == 0.0 and chip.name == "gen2-abcdef01"
    assert chip.hbm_bandwidth_bytes_per_s == row["chip_hbm_bandwidth_bytes_per_s"]
    assert chip.provenance_of("hbm_bandwidth_bytes_per_s").kind == "derived"
    # infeasible by construction (no usable area): zero math and SRAM are what the sweep stored, and are kept
    zeros = {f"chip_{f}": 0.0 for f in ("bf16_flops_per_s", "fp8_flops_per_s", "int8_flops_per_s",
                                         "fp4_flops_per_s", "sram_capacity_bytes", "sram_bandwidth_bytes_per_s")}
    dead = row | zeros | {"_design_reason": "no usable area"}
    assert compare._sweep_chip(dead).fp4_flops_per_s == 0.0
    with pytest.raises(ConfigError, match=r"chip_hbm_bandwidth_bytes_per_s: must be >= 0, got -1.0"):
        compare._sweep_chip(dead | {"chip_hbm_bandwidth_bytes_per_s": -1.0})
    with pytest.raises(ConfigError, match=r"chip_fp4_flops_per_s: must be finite, got nan"):
        compare._sweep_chip(dead | {"chip_fp4_flops_per_s": math.nan})


def test_an_agentic_scenario_chain_is_its_e2e_not_a_multiple_of_it():
    # serving.serve already makes an agentic row's E2E the chain of the scenario's turns (tool gaps included):
    # the report must not multiply it again by report.agent_chain_steps
    agentic = {"agent_chain_steps": 10, "config": {"scenario": {"kind": "agentic", "chain_steps": 4}}}
    s = settings_from_meta(agentic)
    assert s["chain_steps"] == 4 and s["chain_in_e2e"] is True
    closed = settings_from_meta({"agent_chain_steps": 10, "config": {"scenario": {"kind": "closed_loop"}}})
    assert closed["chain_steps"] == 10 and closed["chain_in_e2e"] is False
    table = synthetic_table()
    for meta, factor in ((agentic, 1.0), ({"agent_chain_steps": 10}, 10.0)):
        rec = recommend_from_meta(table, meta)
        base = rec.baseline
        assert rec.metric(base, "chain_latency", 100.0, "A") == pytest.approx(factor * (10.0 + 900.0 / 400.0))
