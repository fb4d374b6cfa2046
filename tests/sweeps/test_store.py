"""The result store: hashes that follow what defines results, atomic part files, resumable sweeps."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arch_space.chip import Chip, stack
from serving.architecture import ModelArchitecture
from serving.precision import Precision
from serving.kernel_table import build_kernel_table
from serving.perf import Mapping, ServingParams
from serving.serve import stack_mappings
from serving.scenario import Scenario
from sweeps.runner import DesignSet, SharedInputs, evaluate_rows, run_sweep
from sweeps.store import ResultStore, atomic_write_table, definition_hash, source_fingerprint
from conftest import load_yaml, tables_equal


def test_hash_is_canonical_and_follows_content():
    a = {"workload": {"layers": 80, "hidden": 8192}, "tp": [1, 2]}
    b = {"tp": [1, 2], "workload": {"hidden": 8192, "layers": 80}}
    assert definition_hash(a) == definition_hash(b)
    assert definition_hash(a) != definition_hash(a | {"tp": [1, 2, 4]})
    assert definition_hash({"x": 1e15}) == definition_hash({"x": 1.0e+15})


def test_source_fingerprint_follows_the_sources_and_nothing_else(tmp_path):
    import hashlib

    pkg = tmp_path / "serving"
    (pkg / "models").mkdir(parents=True)
    (pkg / "perf.py").write_text("x = 1\n")
    (pkg / "models" / "llama.py").write_text("y = 2\n")
    base = source_fingerprint(pkg)
    # an independent oracle: sha256 over "<package>/<relative path>\0<bytes>\0" in sorted path order
    want = hashlib.sha256(b"serving/models/llama.py\0y = 2\n\0serving/perf.py\0x = 1\n\0").hexdigest()[:16]
    assert base == want
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "perf.cpython-311.py").write_text("stale")
    (pkg / "notes.txt").write_text("not code")
    assert source_fingerprint(pkg) == base  # bytecode caches and non-Python files do not count
    (pkg / "perf.py").write_text("x = 2\n")
    changed = source_fingerprint(pkg)
    (pkg / "perf.py").write_text("x = 1\n")
    (pkg / "graph.py").write_text("")
    added = source_fingerprint(pkg)
    assert len({base, changed, added}) == 3


def test_atomic_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    path = tmp_path / "part.parquet"
    table = pa.table({"x": [1, 2, 3]})
    atomic_write_table(table, path)
    assert pq.read_table(path).equals(table)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_table(pa.table({"x": [9]}), path)
    assert pq.read_table(path).equals(table)  # the old part is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part.parquet"]  # no temporary left behind


def _designs(n):
    chips = [Chip.from_dict(load_yaml("hardware/h200_sxm.yaml")).replace(hbm_bandwidth_bytes_per_s=bw)
             for bw in np.linspace(3e12, 9e12, n)]
    ids = [f"d{i:03d}" for i in range(n)]
    feasible = np.ones(n, bool)
    feasible[-1] = False
    reason = [""] * (n - 1) + ["hbm_stacks 20 > 8 package HBM sites"]
    return DesignSet("gen2", ids, ids, ["candidate"] * n, stack(chips), feasible, reason,
                     {"hbm_stacks": np.arange(n, dtype=float)})


def _shared():
    arch = ModelArchitecture.from_dict(load_yaml("workload/llama3_8b.yaml"))
    sc = Scenario.from_dict(load_yaml("scenario/inferencex_1k1k.yaml"))
    kt = build_kernel_table(arch, Precision.from_dict(load_yaml("precision/fp8.yaml")))
    return SharedInputs("llama3_8b", "fp8", sc.name, kt, ServingParams.from_dict(load_yaml("serving/default.yaml")),
                        sc, stack_mappings([Mapping(tp=1), Mapping(tp=2)]), np.asarray(sc.concurrency, np.float32))


def test_rows_are_unique_and_infeasible_designs_keep_their_reason():
    t = evaluate_rows(_shared(), _designs(5))
    keys = list(zip(*(t.column(k).to_pylist() for k in ("design_id", "mapping", "concurrency"))))
    assert len(keys) == len(set(keys)) == 4 * 2 * 11 + 1
    bad = t.filter(pa.compute.equal(t.column("design_id"), "d004"))
    assert bad.num_rows == 1 and not bad.column("feasible")[0].as_py()
    assert "package HBM sites" in bad.column("reason")[0].as_py()


@pytest.mark.slow
def test_interrupted_sweep_resumes_to_the_uninterrupted_result(tmp_path, ray_local):
    shared, designs = _shared(), _designs(12)
    definition = {"test": "resume", "n": 12}
    full = ResultStore(tmp_path / "a", definition)
    run_sweep([designs], shared, full, batch_size=4, max_in_flight=2, progress=False)
    reference = full.read()
    # "interrupted": only the first 5 designs were stored, in batches of another size
    part = ResultStore(tmp_path / "b", definition)
    run_sweep([designs.take(range(5))], shared, part, batch_size=2, max_in_flight=1, progress=False)
    counts = run_sweep([designs], shared, part, batch_size=4, max_in_flight=2, progress=False)
    assert counts["evaluated_designs"] == 7
    assert tables_equal(part.read(), reference)
    assert run_sweep([designs], shared, part, batch_size=4, max_in_flight=2, progress=False)["evaluated_designs"] == 0
    assert full.sweep_id == part.sweep_id  # the hash ignores where results go and how they were batched
