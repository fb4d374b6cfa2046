"""serving/compile.py: the serving model's programs compile without the XLA:CPU fusions that miscompiled them.

The oracle is a property every correct vmapped program has: permuting the batch axis permutes the rows, and a row
computed among other designs equals that row computed among copies of itself. The program is the one XLA:CPU got
wrong, exported from commit 4e1bad3 (fixtures/ynn_miscompile/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from serving import compile as sc

FIXTURE = Path(__file__).parent / "fixtures" / "ynn_miscompile"
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA:CPU's")


@pytest.fixture(scope="module")
def exported():
    meta = json.loads((FIXTURE / "meta.json").read_text())
    exp = jax.export.deserialize(bytearray((FIXTURE / "module.bin").read_bytes()))
    npz = np.load(FIXTURE / "inputs.npz")
    return meta, exp, [npz[k] for k in sorted(npz.files)]


def _rows(xs, nb, idx):
    return [x[idx] if i < nb else x for i, x in enumerate(xs)]


@cpu_only
def test_the_4e1bad3_batch_is_right_compiled_as_the_serving_model_compiles(exported):
    meta, exp, xs = exported
    nb, n, real = meta["chip_leaves"], meta["padded_rows"], meta["real_rows"]
    f = sc.jit(exp.call)
    base = [np.asarray(o) for o in f(*xs)]
    roll = np.roll(np.arange(n), n // 2)
    rolled = [np.asarray(o) for o in f(*_rows(xs, nb, roll))]
    for name, a, b in zip(meta["outputs"], base, rolled):
        np.testing.assert_allclose(b, a[roll], rtol=1e-5, atol=0, equal_nan=True, err_msg=name)
    for r in (12, 18, 30, 48, real - 6):  # rows that came out unlike their copies' under plain jax.jit
        alone = [np.asarray(o) for o in f(*_rows(xs, nb, np.full(n, r)))]
        for name, a, b in zip(meta["outputs"], base, alone):
            np.testing.assert_allclose(b[0], a[r], rtol=1e-5, atol=0, equal_nan=True, err_msg=f"{name} row {r}")


@cpu_only
def test_the_serving_programs_compile_without_ynn_fusions():
    """evaluate_grid as the sweeps call it carries no YNNPACK fusion; the same function under plain jax.jit does
    (so this test sees them when they are there)."""
    from serving.serve import evaluate_grid
    from test_serve import CONC, DEFAULT, KT_MOE, MAPS, SC, chip, stack  # its small grid (tests/serving)

    # a sweep-sized batch: XLA forms its library fusions only over large enough reductions (2 designs get none)
    chips = stack([chip(hbm_bandwidth_bytes_per_s=b) for b in np.linspace(2e12, 16e12, 128)])
    args = (chips, KT_MOE, DEFAULT, SC, MAPS, CONC)
    assert sc.compiler_options() == sc.CPU_OPTIONS
    ours = evaluate_grid.lower(*args).compile().as_text()
    plain = jax.jit(evaluate_grid.__wrapped__).lower(*args).compile().as_text()
    assert "__ynn_fusion" in plain
    assert "__ynn_fusion" not in ours


def test_a_jaxlib_without_the_option_compiles_plainly(monkeypatch):
    """An option this jaxlib does not know fails the probe, and the programs compile with none."""
    monkeypatch.setattr(sc, "CPU_OPTIONS", {"xla_cpu_no_such_option": ""})
    monkeypatch.setattr(sc, "_chosen", [])
    assert sc.compiler_options() == {}
    assert float(sc.jit(lambda x: x * 2.0)(3.0)) == 6.0
