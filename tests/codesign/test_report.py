"""The report: figures with labelled axes, valid PNGs, escaped HTML, and `python -m codesign.report sweep=DIR`
regenerating it from a stored run directory without running a sweep."""

import json
import subprocess
import sys

import matplotlib.pyplot as plt
import pyarrow.parquet as pq
import pytest
from test_recommend import synthetic_table

from codesign import report, report_tables
from codesign.figures import make_figures
from codesign.recommend import recommend_from_meta

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert('x')</script>"


def synthetic_meta(with_extras=True) -> dict:
    meta = {
        "title": f"Study {EVIL}", "precision": "fp4", "scenario": "inferencex_8k1k", "workload": "A",
        "mix": {"A": 0.5, "B": 0.5}, "agent_chain_steps": 6, "targets": [50, 100, 300],
        "objective": "total_tok_s_per_kw",
        "hardware_name": "base", "hardware_values": {"hbm_bandwidth_bytes_per_s": 8e12},
        "hardware_provenance": {"hbm_bandwidth_bytes_per_s": {"kind": "datasheet", "source": f"vendor {EVIL}"}},
        "generations": {"gen2": {"logic_node": "N3", "provenance": {"logic_node": {"kind": "projected",
                                                                                   "source": "roadmap"}}}},
        "serving": {"gemm_efficiency_max": 0.26, "fit": {"fitted": ["gemm_efficiency_max"], "data": "cal.csv",
                                                         "rows": 58, "median_abs_error_pct": 28,
                                                         "p90_abs_error_pct": 77}},
        "model_note": "synthetic",
        "config": {"report": {"objective": "total_tok_s_per_kw", "interactivity_targets_tok_s_user": [50, 100, 300],
                              "top_k": 3, "dpi": 60, "title": EVIL}},
    }
    if with_extras:
        meta["sensitivity"] = [{
            "design_id": "d8", "name": "gen2-d8", "generation": "gen2", "workload": w, "metric": "total_tok_s_per_kw",
            "target_tok_s_user": 100.0, "resources": [
                {"resource": "hbm_bandwidth_bytes_per_s", "label": "HBM bandwidth", "elasticity": 0.6,
                 "gain_pct_gradient": 6.0, "gain_pct_fd": 5.8, "method": "gradient"},
                {"resource": "fp4_flops_per_s", "label": "FP4 compute", "elasticity": 0.1, "gain_pct_gradient": 1.0,
                 "gain_pct_fd": 1.1, "method": "gradient"},
                {"resource": "power_rating_w", "label": "power", "elasticity": -0.2, "gain_pct_gradient": -2.0,
                 "gain_pct_fd": None, "method": "fd only"}]} for w in ("A", "B")]
        meta["attribution"] = [{"design_id": d, "name": d, "workload": "A", "phase": ph, "compute_s": 0.002,
                                "memory_s": 0.004, "network_s": 0.001, "overhead_s": 0.0005, "power_s": 0.0,
                                "total_s": 0.0075} for d in ("base", "d8") for ph in ("prefill", "decode")]
        meta["roofline"] = [{"design_id": "d8", "name": "gen2-d8", "workload": "A", "peak_flops_per_s": 2e16,
                             "hbm_bandwidth_bytes_per_s": 8e12, "sram_bandwidth_bytes_per_s": 4e13, "points": [
                                 {"kernel": "layer_0/attention", "phase": "decode", "flops": 1e9, "bytes": 1e9,
                                  "time_s": 2e-4, "intensity_flop_per_byte": 1.0, "achieved_flops_per_s": 5e12},
                                 {"kernel": "layer_0/mlp", "phase": "prefill", "flops": 1e13, "bytes": 1e10,
                                  "time_s": 1e-3, "intensity_flop_per_byte": 1000.0,
                                  "achieved_flops_per_s": 1e16}]}]
    return meta


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    pq.write_table(synthetic_table(), d / "results.parquet")
    (d / "study.json").write_text(json.dumps(synthetic_meta()))
    return d


def _axes_ok(fig):
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            assert ax.get_ylabel() or ax.get_xlabel(), "colour bar without a label"
            continue
        assert ax.get_xlabel().strip(), f"no x label on {ax.get_title()!r}"
        assert ax.get_ylabel().strip(), f"no y label on {ax.get_title()!r}"


@pytest.mark.parametrize("workloads,extras", [(("A", "B"), True), (("A",), False)])
def test_every_figure_has_labelled_axes(workloads, extras):
    table = synthetic_table(workloads=workloads)
    meta = synthetic_meta(with_extras=extras)
    if len(workloads) == 1:
        meta["mix"] = {"A": 1.0}
    rec = recommend_from_meta(table, meta)
    figs, notes = make_figures(table, rec, meta)
    expected = {"frontier_per_chip", "frontier_per_kw", "generation_gains", "objective_at_targets", "design_space"}
    assert expected <= set(figs)
    if extras:
        assert {"sensitivity", "roofline", "attribution"} <= set(figs) and not notes
    else:
        assert not {"sensitivity", "roofline", "attribution"} & set(figs) and len(notes) == 3
    try:
        for name, fig in figs.items():
            assert fig.axes, name
            _axes_ok(fig)
        # one frontier panel per workload
        assert len([a for a in figs["frontier_per_chip"].axes if a.get_label() != "<colorbar>"]) == len(workloads)
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_report_renders_from_a_stored_run_without_running_a_sweep(run_dir, tmp_path, monkeypatch):
    import sweeps.runner

    def boom(*a, **k):
        raise AssertionError("the report must not evaluate anything")

    monkeypatch.setattr(sweeps.runner, "run_sweep", boom)
    monkeypatch.setattr(sweeps.runner, "evaluate_rows", boom)
    out = tmp_path / "elsewhere"
    paths = report.regenerate(run_dir, out)
    for name in ("frontier_per_chip", "frontier_per_kw", "generation_gains", "design_space", "sensitivity",
                 "roofline", "attribution"):
        assert paths[name] == out / "figures" / f"{name}.png"
        assert paths[name].read_bytes()[:8] == PNG_MAGIC
    for png in (out / "figures").glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
    page = (out / "report.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("data:image/png;base64,") == len(list((out / "figures").glob("*.png")))
    for heading in ("Headline", "Generation comparison", "Selection over the mix", "Sensitivity and bottlenecks",
                    "Recommended designs: all parameters", "Assumptions and sources"):
        assert heading in page
    assert "HBM bandwidth" in page and "TB/s" in page and "mm^2" in page and "new axis" in page  # discovered axis
    assert "rental" in page  # the cost caveat
    md = (out / "summary.md").read_text()
    assert "<script>" not in md and "](figures/frontier_per_chip.png)" in md
    assert json.loads((out / "study.json").read_text())["title"] == f"Study {EVIL}"
    assert not (run_dir / "report.html").exists()  # output= writes elsewhere, the run directory is untouched


def test_report_command_in_process(run_dir, monkeypatch, capsys):
    import sweeps.runner

    monkeypatch.setattr(sweeps.runner, "run_sweep", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    monkeypatch.setattr(sys, "argv", ["codesign.report", f"sweep={run_dir}", "dpi=50"])
    report.cli()
    out = capsys.readouterr().out
    assert str(run_dir / "report.html") in out
    assert (run_dir / "figures" / "generation_gains.png").read_bytes()[:8] == PNG_MAGIC


def test_display_units():
    assert report_tables.display_unit("chip_fp4_flops_per_s")[1:] == ("PF/s", 1e-15)
    assert report_tables.display_unit("chip_hbm_bandwidth_bytes_per_s")[1:] == ("TB/s", 1e-12)
    assert report_tables.display_unit("chip_hbm_capacity_bytes")[1:] == ("GB", 1e-9)
    assert report_tables.display_unit("chip_die_area_m2")[1:] == ("mm^2", 1e6)
    assert report_tables.display_unit("chip_power_rating_w")[1] == "W" and report_tables.display_unit("chip_cost_usd")[1] == "$"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "codesign.report", *args], capture_output=True, text=True,
                          timeout=120)


def test_report_command_rejects_bad_input_in_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.parquet").write_bytes(b"not parquet at all")
    (bad / "study.json").write_text("{}")
    nometa = tmp_path / "nometa"
    nometa.mkdir()
    pq.write_table(synthetic_table(workloads=("A",)), nometa / "results.parquet")
    cases = [([f"sweep={tmp_path / 'nope'}"], "no such directory"), ([f"sweep={empty}"], "no results.parquet"),
             ([f"sweep={nometa}"], "no study.json"), ([f"sweep={bad}"], "as Parquet"), ([], "required")]
    for argv, expect in cases:
        proc = _run(*argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("codesign.report: error: sweep: "), proc.stderr
        assert expect in lines[0] and "Traceback" not in proc.stderr


def test_assumed_serving_parameters_cite_the_starting_configs_reason():
    meta = {"serving": {"moe_rows_floor": 16.0, "gemm_efficiency_max": 0.44, "attention_rows_half": 64.0,
                        "fit": {"fitted": ["gemm_efficiency_max"], "data": "cal.csv", "rows": 3,
                                "median_abs_error_pct": 8.0, "p90_abs_error_pct": 24.5}},
            "serving_sources": {"moe_rows_floor": "smallest small-M tile (assumed)"}}
    rows = {r[0]: r for r in report_tables.assumptions(meta)}
    assert rows["serving.moe_rows_floor"][2:] == ["assumed", "conf/serving/default.yaml: smallest small-M tile "
                                                              "(assumed)"]
    assert rows["serving.gemm_efficiency_max"][2] == "fitted" and "cal.csv" in rows["serving.gemm_efficiency_max"][3]
    # a stored run from before the sources were kept still renders, with the generic source
    assert rows["serving.attention_rows_half"][2:] == ["assumed", "conf/serving (serving-model parameter, not "
                                                                  "fitted)"]


def test_an_overhead_bound_decode_step_at_the_target_gets_a_note_naming_the_assumed_parameters():
    def entry(name, workload, phase, overhead, total):
        return {"name": name, "workload": workload, "phase": phase, "overhead_s": overhead, "total_s": total}

    meta = {"attribution": [entry("gen1", "big_moe", "decode", 6.9e-3, 10e-3), entry("gen3", "big_moe", "decode",
                                                                                     5.8e-3, 10e-3),
                            entry("gen1", "big_moe", "prefill", 9e-3, 10e-3),  # prefill: not the decode step
                            entry("gen1", "dense", "decode", 3e-3, 10e-3),  # under half: no note for it
                            entry("gen3", "dense", "decode", 5e-3, 10e-3)]}  # exactly half counts
    note = report_tables.overhead_note(meta, 100.0)
    assert note.startswith("Fixed overheads are at least half of the decode step at 100 tok/s/user on "
                           "big_moe 58%-69% (gen1, gen3); dense 50% (gen3): ")
    assert "serving.kernel_overhead_s" in note and "serving.step_overhead_s" in note
    assert "rerun with serving.kernel_overhead_s=... to see how far" in note
    # candidates on a fitted family's set: the knob that moves them is that family's
    fam = report_tables.overhead_note(meta | {"serving": {"unmeasured_family": "nvidia"}}, 100.0)
    assert "rerun with serving.families.nvidia.kernel_overhead_s=... (candidates run the nvidia set here" in fam
    meta_low = {"attribution": [entry("gen1", "dense", "decode", 3e-3, 10e-3), entry("gen1", "big_moe", "prefill",
                                                                                     9e-3, 10e-3)]}
    assert report_tables.overhead_note(meta_low, 100.0) is None
    assert report_tables.overhead_note({}, 100.0) is None


def test_vendor_family_sets_are_rows_of_their_own_in_the_assumptions():
    fit = {"fitted": ["kernel_overhead_s"], "data": "cal.csv", "rows": 3, "median_abs_error_pct": 8.0,
           "p90_abs_error_pct": 24.5}
    meta = {"serving": {"kernel_overhead_s": 8e-6, "fit": fit, "unmeasured_family": None,
                        "families": {"nvidia": {"kernel_overhead_s": 7.1e-6}, "amd": {"kernel_overhead_s": 1.1e-5}}}}
    rows = {r[0]: r for r in report_tables.assumptions(meta)}
    assert "serving.families" not in rows  # no dict dumped into a cell
    assert rows["serving.families.nvidia.kernel_overhead_s"][1:3] == ["7.1e-06", "fitted"]
    assert "nvidia chips' set" in rows["serving.families.nvidia.kernel_overhead_s"][3]
    assert "cal.csv" in rows["serving.families.amd.kernel_overhead_s"][3]
    assert rows["serving.unmeasured_family"][1:3] == ["null", "assumed"]
    assert "the shared set" in rows["serving.unmeasured_family"][3]
    chosen = {r[0]: r for r in report_tables.assumptions(
        {"serving": meta["serving"] | {"unmeasured_family": "nvidia"}})}
    assert chosen["serving.unmeasured_family"][1] == "nvidia"
    assert "the nvidia family's fitted set" in chosen["serving.unmeasured_family"][3]
