"""A design's rows do not depend on the batch it is evaluated in.

The sweep evaluates a batch of designs in one jit-compiled, vmapped call, padded to the batch size (sweeps/runner.py),
and a design's rows must be the ones it gets alone. The small-batch check in tests/serving/test_serve.py did not
catch this: at commit 4e1bad3, XLA compiled the default study's 256-design batches so that up to 66% of a
design's TPOT went missing, while the same code gave the right figures one design at a time, and gave them in
batches too with jit disabled. The cause was XLA:CPU's YNNPACK reduce fusions, which the serving programs now compile
without (serving/compile.py, tests/serving/test_compile.py); this test keeps checking the result, whatever the
compiler does. Here the oracle is each design evaluated alone, against a real batch of the default study (every
candidate of a generation, on the primary workload, at the study's batch size).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from codesign.cli import CONF_DIR
from codesign.schema import load_study
from codesign.study import _shared, candidate_designs
from sweeps.runner import evaluate_rows

METRICS = ("tpot_s", "ttft_s", "decode_compute_s", "total_tok_s_per_kw")


@pytest.fixture(scope="module")
def study():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return load_study(OmegaConf.to_container(compose("config"), resolve=True))


@pytest.mark.slow
@pytest.mark.parametrize("generation", ["gen2", "gen3"])
def test_a_design_in_a_full_batch_gets_the_rows_it_gets_alone(study, generation):
    ds = next(d for d in candidate_designs(study) if d.generation == generation)
    bs = study.sweep.batch_size
    order = sorted(range(len(ds)), key=lambda i: ds.design_id[i])[:bs]  # the runner's first batch
    shared = dataclasses.replace(_shared(study, study.workload), pad_to=bs)
    key = ("design_id", "mapping", "concurrency")
    batch = {tuple(r[k] for k in key): r for r in evaluate_rows(shared, ds.take(order)).to_pylist()}
    feasible = [i for i in order if ds.feasible[i]]
    assert len(feasible) >= 24
    checked = 0
    for i in feasible[:: len(feasible) // 12]:  # a spread of designs, each evaluated alone (padded to 64 copies)
        for row in evaluate_rows(shared, ds.take([i])).to_pylist():
            got = batch[tuple(row[k] for k in key)]
            for m in METRICS:
                if row[m] is None or not np.isfinite(row[m]):
                    assert got[m] is None or not np.isfinite(got[m]), (m, row["design_id"], row["mapping"])
                    continue
                assert got[m] == pytest.approx(row[m], rel=1e-5), (m, row["design_id"], row["mapping"],
                                                                   row["concurrency"])
                checked += 1
    assert checked > 1000
