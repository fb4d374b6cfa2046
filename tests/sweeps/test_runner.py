"""The Ray sweep runner under faults: a worker killed mid-sweep and a driver interrupted mid-sweep both end in the
dataset an uninterrupted run writes, bit for bit, with every design exactly once; frontier-only storage keeps
exactly each design's Pareto points."""

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from arch_space.errors import ConfigError
from sweeps import ray_workers, runner
from sweeps.runner import evaluate_rows, frontier_mask, run_sweep
from sweeps.store import ResultStore
from conftest import tables_equal

sys.path.insert(0, str(Path(__file__).parent))
from test_store import _designs, _shared  # noqa: E402


def brute_force_frontier(x, y):
    """O(P^2) oracle: i is kept iff feasible and no j has x_j >= x_i, y_j >= y_i with one strict."""
    keep = []
    for i in range(len(x)):
        if not (np.isfinite(x[i]) and np.isfinite(y[i])):
            continue
        beaten = any(np.isfinite(x[j]) and np.isfinite(y[j]) and x[j] >= x[i] and y[j] >= y[i]
                     and (x[j] > x[i] or y[j] > y[i]) for j in range(len(x)))
        # of exact duplicates keep one
        dup_before = any(x[j] == x[i] and y[j] == y[i] for j in keep)
        if not beaten and not dup_before:
            keep.append(i)
    return set(keep)


def test_frontier_mask_matches_brute_force():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 8, (50, 30)).astype(float)
    y = rng.integers(0, 8, (50, 30)).astype(float)
    x[rng.uniform(size=x.shape) < 0.15] = np.nan
    m = frontier_mask(x, y)
    for r in range(len(x)):
        got = set(np.flatnonzero(m[r]).tolist())
        ref = brute_force_frontier(x[r], y[r])
        assert len(got) == len(ref)
        assert {(x[r][i], y[r][i]) for i in got} == {(x[r][i], y[r][i]) for i in ref}


def test_frontier_storage_keeps_exactly_each_designs_pareto_points():
    import dataclasses

    shared, designs = _shared(), _designs(5)
    full = evaluate_rows(shared, designs)
    front = evaluate_rows(dataclasses.replace(shared, keep="frontier"), designs)
    key = ("design_id", "mapping", "concurrency")
    got = set(zip(*(front.column(k).to_pylist() for k in key)))
    want = set()
    for d in designs.design_id:
        rows = full.filter(pc.equal(full.column("design_id"), d))
        feas = rows.column("feasible").to_pylist()
        if not any(feas):  # infeasible by construction: one row with the reason
            want.add((d, rows.column("mapping")[0].as_py(), rows.column("concurrency")[0].as_py()))
            continue
        x = np.asarray([v if f else np.nan for v, f in zip(rows.column("interactivity_tok_s_user").to_pylist(), feas)])
        y = np.asarray(rows.column("total_tok_s_per_chip").to_pylist(), float)
        for i in brute_force_frontier(x, y):
            want.add(tuple(rows.column(k)[i].as_py() for k in key))
    assert got == want
    assert front.num_rows < full.num_rows  # a real reduction (15 mappings x 11 concurrencies: ~10x in the bench)


def _kill_first_attempt(store_root_parent, definition, shared, ds):
    """The Ray task body with a fault: the worker running the batch holding the victim design dies (os._exit, no
    cleanup, as an OOM kill or a lost node) on its first attempt; Ray's retry then runs it normally."""
    marker = Path(definition["marker_dir"]) / "killed"
    if definition["victim"] in ds.design_id and not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)
    return runner._evaluate_and_store(store_root_parent, definition, shared, ds)


@pytest.mark.slow
def test_killed_worker_batch_is_retried_to_the_uninterrupted_result(tmp_path, ray_local):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import the tests
    shared, designs = _shared(), _designs(12)
    definition = {"test": "fault", "marker_dir": str(tmp_path), "victim": "d005"}
    reference = ResultStore(tmp_path / "a", definition)
    run_sweep([designs], shared, reference, batch_size=3, max_in_flight=2, progress=False)
    faulty = ResultStore(tmp_path / "b", definition)
    counts = run_sweep([designs], shared, faulty, batch_size=3, max_in_flight=2, max_retries=2, progress=False,
                       task=_kill_first_attempt)
    assert (tmp_path / "killed").exists()  # the fault really happened
    assert counts["evaluated_designs"] == 12
    out = faulty.read()
    assert tables_equal(out, reference.read())
    ids = out.column("design_id").to_pylist()
    assert sorted(set(ids)) == sorted(designs.design_id)
    keys = list(zip(ids, out.column("mapping").to_pylist(), out.column("concurrency").to_pylist()))
    assert len(keys) == len(set(keys))


@pytest.mark.slow
def test_interrupted_driver_resumes_without_writing_twice(tmp_path, ray_local):
    shared, designs = _shared(), _designs(12)
    definition = {"test": "driver-interrupt"}
    reference = ResultStore(tmp_path / "a", definition)
    run_sweep([designs], shared, reference, batch_size=2, max_in_flight=2, progress=False)

    def interrupt(done):
        if done >= 4:
            raise KeyboardInterrupt  # Ctrl-C on the driver after some batches

    store = ResultStore(tmp_path / "b", definition)
    with pytest.raises(KeyboardInterrupt):
        run_sweep([designs], shared, store, batch_size=2, max_in_flight=2, progress=False, on_batch=interrupt)
    written = {p: p.stat().st_mtime_ns for p in store.parts()}
    assert 2 <= len(written) < 6
    counts = run_sweep([designs], shared, store, batch_size=2, max_in_flight=2, progress=False)
    assert counts["evaluated_designs"] <= 12 - 2 * len(written) + 2 * 2  # at most the in-flight batches again
    for p, t in written.items():
        assert p.stat().st_mtime_ns == t  # parts from before the interrupt are not rewritten
    assert tables_equal(store.read(), reference.read())


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_workers_claim_distinct_cores_and_release_them_on_exit(tmp_path):
    import subprocess

    code = ("import os, sys, time; from sweeps.ray_workers import pin_worker_to_a_core as p; "
            "c = p(sys.argv[1]); print(c, sorted(os.sched_getaffinity(0)), flush=True); time.sleep(float(sys.argv[2]))")
    root = str(Path(__file__).resolve().parents[2])
    cores = sorted(os.sched_getaffinity(0))
    holders = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "3"], stdout=subprocess.PIPE, text=True,
                                cwd=root) for _ in cores]
    got = [h.stdout.readline().split(" ", 1) for h in holders]
    claimed = sorted(int(c) for c, _ in got)
    assert claimed == cores  # one core each, every thread of the process on it
    assert all(a.strip() == f"[{c}]" for c, a in got)
    extra = subprocess.run([sys.executable, "-c", code, str(tmp_path), "0"], capture_output=True, text=True, cwd=root)
    assert extra.stdout.startswith("None")  # more workers than cores: left unpinned
    for h in holders:
        h.wait()
    again = subprocess.run([sys.executable, "-c", code, str(tmp_path), "0"], capture_output=True, text=True, cwd=root)
    assert again.stdout.split(" ", 1)[0] == str(cores[0])  # the locks died with their processes


def test_compare_code_names_both_source_trees():
    ray_workers.compare_code(("abc", "/a"), ("abc", "/b"))  # the same sources from two places are the same code
    with pytest.raises(ConfigError, match=r"ray workers: evaluate the sources in /b \(fingerprint def\) but this "
                                          r"process imported /a \(abc\)"):
        ray_workers.compare_code(("abc", "/a"), ("def", "/b"))


@pytest.mark.slow
def test_init_ray_refuses_workers_that_import_another_checkout(tmp_path):
    """Ray puts the driver's working directory first on its workers' path: a driver that imports the framework from
    this checkout but runs in a directory holding a modified copy must fail in one line, not evaluate the copy."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[2]
    for pkg in ("arch_space", "serving", "sweeps"):
        shutil.copytree(root / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "serving" / "__init__.py", "a") as f:
        f.write("# a local edit\n")
    code = "from sweeps.ray_workers import init_ray; init_ray(None, 1); print('ok')"
    env = dict(os.environ, PYTHONPATH=str(root))
    # -P: the driver does not put its working directory on its own path (as the `codesign` console script)
    bad = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0
    assert f"ray workers: evaluate the sources in {tmp_path}" in bad.stderr and str(root) in bad.stderr
    good = subprocess.run([sys.executable, "-P", "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert good.returncode == 0 and good.stdout.strip() == "ok", good.stderr[-2000:]


def test_a_batch_whose_compiled_rows_leak_between_designs_fails_loudly(monkeypatch):
    """The guard against a miscompiled batch (sweeps/runner.py: _verify_compiled_batch): a fake evaluation that
    lets designs of one batch shift each other's figures, as XLA's did at 4e1bad3, fails the batch with one line
    naming the design and the metric; the true evaluation passes, and is checked once per compiled shape."""
    import dataclasses

    real = runner.evaluate_grid
    calls = []

    def leaky(chips, *args):
        out = real(chips, *args)
        bw = np.asarray(chips.hbm_bandwidth_bytes_per_s)
        if np.ptp(bw) == 0:  # copies of one design: nothing to leak
            return out
        return {k: np.asarray(v) * (1.0 + 0.1 * (k == "ttft_s")) for k, v in out.items()}

    shared, designs = dataclasses.replace(_shared(), pad_to=64), _designs(5)
    monkeypatch.setattr(runner, "_VERIFIED", set())
    monkeypatch.setattr(runner, "evaluate_grid", leaky)
    with pytest.raises(RuntimeError, match=r"sweeps: design \w+ .* gets ttft_s .* in a batch of \d+ designs but .* "
                                           r"alone: the compiled batch evaluation is wrong"):
        evaluate_rows(shared, designs)
    monkeypatch.setattr(runner, "_VERIFIED", set())

    def by_position(chips, *args):  # as at 4e1bad3 in Gen 2's first batch: figures that depend on where a design
        out = real(chips, *args)    # sits, the middle design's position spared
        bw = np.asarray(chips.hbm_bandwidth_bytes_per_s)
        if np.ptp(bw) == 0:
            return out
        pos = np.arange(len(bw), dtype=float)
        f = np.where(pos == int(np.sum(designs.feasible)) // 2, 1.0, 1.0 + 0.01 * (pos + 1))
        return {k: np.asarray(v) * (f.reshape((-1,) + (1,) * (np.ndim(v) - 1)) if k == "tpot_s" else 1.0)
                for k, v in out.items()}

    monkeypatch.setattr(runner, "evaluate_grid", by_position)
    with pytest.raises(RuntimeError, match=r"sweeps: design \w+ .* gets tpot_s .* in a batch of \d+ designs but .* "
                                           r"at another position of the batch: the compiled batch evaluation"):
        evaluate_rows(shared, designs)
    monkeypatch.setattr(runner, "_VERIFIED", set())
    monkeypatch.setattr(runner, "evaluate_grid", lambda chips, *a: calls.append(0) or real(chips, *a))
    first = evaluate_rows(shared, designs)
    assert len(calls) == 3  # the batch, the batch rolled, its middle design alone
    calls.clear()
    assert tables_equal(evaluate_rows(shared, designs), first) and len(calls) == 1  # this shape is verified
