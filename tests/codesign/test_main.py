"""The main job end to end on a reduced override: config -> designs -> Ray -> Parquet -> figures -> report."""

import re
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from conftest import tables_equal

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(args, timeout=170):
    return subprocess.run([sys.executable, "-m", "codesign.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_smoke_study_writes_results_figures_and_report_then_resumes(tmp_path):
    store = tmp_path / "store"
    t0 = time.perf_counter()
    proc = run(["experiment=smoke", f"hydra.run.dir={tmp_path / 'run1'}", f"sweep.output_dir={store}"])
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert elapsed < 60, f"smoke study took {elapsed:.0f} s"
    run1 = tmp_path / "run1"
    for rel in ("results.parquet", "report.html", "summary.md", "study.json", "figures/frontier_per_chip.png",
                "figures/frontier_per_kw.png", "figures/generation_gains.png", "figures/design_space.png"):
        assert (run1 / rel).exists(), rel
    for png in (run1 / "figures").glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
    assert str(run1 / "report.html") in proc.stdout
    table = pq.read_table(run1 / "results.parquet")
    kinds = set(table.column("kind").to_pylist())
    assert kinds == {"baseline", "competitor", "candidate"}
    assert set(table.column("generation").to_pylist()) == {"presets", "gen2", "gen3"}
    # 2 presets + 8 designs per generation, every operating point once
    keys = list(zip(*(table.column(k).to_pylist() for k in ("design_id", "mapping", "concurrency"))))
    assert len(keys) == len(set(keys))
    assert len(set(table.column("design_id").to_pylist())) == 2 + 2 * 8
    html = (run1 / "report.html").read_text()
    assert "data:image/png;base64," in html and "Assumptions and sources" in html
    m = re.search(r"(\d+) designs evaluated now", proc.stdout)
    assert m and int(m.group(1)) == 18

    # same study again: everything is in the store, nothing is evaluated twice, the rows are identical
    proc2 = run(["experiment=smoke", f"hydra.run.dir={tmp_path / 'run2'}", f"sweep.output_dir={store}",
                 "sweep.num_workers=2", "sweep.batch_size=3"])
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert "0 designs evaluated now" in proc2.stdout
    assert tables_equal(pq.read_table(tmp_path / "run2" / "results.parquet"), table)


@pytest.mark.slow
def test_sampled_space_with_refinement_over_a_workload_mix(tmp_path):
    """A Sobol' space refined along the gradients, over a two-model mix: every design appears once per workload,
    refined designs are marked and evaluated on both workloads, and the report carries the mix's analysis."""
    import json

    run_dir = tmp_path / "run"
    proc = run(["experiment=smoke", f"hydra.run.dir={run_dir}", f"sweep.output_dir={tmp_path / 'store'}",
                "space=sobol", "space.samples=16", "space.refine_top_k=2", "space.refine_steps=10",
                "generation=[gen2]", "mix=[llama3_8b,gpt_oss_20b]", "scenario.concurrency=[1,4,16,64]",
                "report.interactivity_targets_tok_s_user=[20,50,100]"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refined" in proc.stdout
    table = pq.read_table(run_dir / "results.parquet")
    assert set(table.column("workload").to_pylist()) == {"llama3_8b", "gpt_oss_20b"}
    per_workload = {}
    for d, w in zip(table.column("design_id").to_pylist(), table.column("workload").to_pylist()):
        per_workload.setdefault(w, set()).add(d)
    assert per_workload["llama3_8b"] == per_workload["gpt_oss_20b"]
    origins = dict(zip(table.column("design_id").to_pylist(), table.column("origin").to_pylist()))
    assert sum(o == "sobol" for o in origins.values()) == 16
    assert 1 <= sum(o == "refined" for o in origins.values()) <= 2
    meta = json.loads((run_dir / "study.json").read_text())
    assert meta["mix"] == {"llama3_8b": 1.0, "gpt_oss_20b": 1.0}
    assert {r["workload"] for r in meta["attribution"]} == {"llama3_8b", "gpt_oss_20b"}
    assert {r["workload"] for r in meta["sensitivity"]} == {"llama3_8b", "gpt_oss_20b"}


@pytest.mark.slow
def test_multirun_across_workloads_and_generations(tmp_path):
    proc = run(["-m", "experiment=smoke", "workload=llama3_8b,gpt_oss_20b", "generation=gen2,gen3",
                f"hydra.sweep.dir={tmp_path / 'multi'}", f"sweep.output_dir={tmp_path / 'store'}",
                "space.compute_dies=[1]", "space.hbm_stacks=[6]"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted((tmp_path / "multi").glob("*/results.parquet"))
    assert len(jobs) == 4
    seen = set()
    for j in jobs:
        t = pq.read_table(j)
        (w,), gens = set(t.column("workload").to_pylist()), set(t.column("generation").to_pylist())
        seen.add((w, tuple(sorted(gens - {"presets"}))))
    assert seen == {(w, (g,)) for w in ("llama3_8b", "gpt_oss_20b") for g in ("gen2", "gen3")}
