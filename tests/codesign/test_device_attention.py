"""codesign/device_attention.py: the device's attention curve, swept on the model code and fitted.

The fit's oracle is the closed form it fits, evaluated at known parameters (a memory-bound floor included), which the
fit must recover; the sweep is checked for its FLOP and byte counts by formula.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from codesign.device_attention import GROUPS, attention_sweep, fit_attention_curve

RATE, BW = 400e9, 35e9


def synthetic(e_max, half, rate=RATE, bw=BW, batch=8, context=512, kv_heads=8, head_dim=128):
    g = np.asarray(GROUPS, np.float64)
    flops = 4.0 * batch * kv_heads * g * context * head_dim
    kv_bytes = 2.0 * batch * context * kv_heads * head_dim * 4
    t = np.maximum(flops / (rate * e_max * g / (g + half)), kv_bytes / bw)
    return {"rows": list(GROUPS), "seconds": list(t), "flops": list(flops), "kv_bytes": kv_bytes}


@pytest.mark.parametrize("e_max, half", [(0.27, 94.0), (0.01, 16.0), (0.05, 2.0), (0.02, 0.0)])
def test_the_fit_recovers_the_curve_it_was_generated_from(e_max, half):
    """Compute-bound at every group (a CPU's case: this VM's fit was e_max 0.27, rows_half 94)."""
    data = synthetic(e_max, half)
    assert min(data["seconds"]) > data["kv_bytes"] / BW
    fit = fit_attention_curve(data, RATE, BW)
    assert fit["attention_efficiency_max"] == pytest.approx(e_max, rel=0.05)
    assert fit["attention_rows_half"] == pytest.approx(half, rel=0.05, abs=0.2)
    np.testing.assert_allclose(fit["predicted_over_measured"], 1.0, rtol=0.05)


def test_memory_bound_points_stay_on_the_kv_stream():
    """A GPU's case: the smallest groups stream the KV cache (their time says nothing of the compute curve), the
    largest are compute-bound; the fit reproduces every point and recovers the curve from the compute-bound ones."""
    rate, bw = 100e12, 4.8e12
    data = synthetic(0.5, 16.0, rate=rate, bw=bw, batch=64, context=4096)
    t_mem = data["kv_bytes"] / bw
    bound = np.isclose(data["seconds"], t_mem)
    assert bound[0] and not bound[-1]
    fit = fit_attention_curve(data, rate, bw)
    np.testing.assert_allclose(fit["predicted_over_measured"], 1.0, rtol=0.05)
    assert fit["attention_efficiency_max"] == pytest.approx(0.5, rel=0.15)


def test_the_sweep_counts_its_flops_and_kv_bytes():
    sw = attention_sweep(jnp.float32, batch=2, context=16, reps=1, stat="median")
    assert sw["rows"] == list(GROUPS) and len(sw["seconds"]) == len(GROUPS) and min(sw["seconds"]) > 0
    for g, f in zip(sw["rows"], sw["flops"]):
        assert f == 4 * 2 * 8 * g * 16 * 128  # QK^T and PV: 2 FLOPs a multiply-add each
    assert sw["kv_bytes"] == 2 * 2 * 16 * 8 * 128 * 4
