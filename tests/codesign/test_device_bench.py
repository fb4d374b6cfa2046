"""The GEMM efficiency-curve fit of ``codesign.execute``'s device description, on synthetic timings generated from
a known curve in closed form (the fit must recover it)."""

import numpy as np
import pytest


def test_gemm_curve_fit_recovers_a_known_curve():
    from codesign.device_bench import fit_gemm_curve
    from serving.perf import ServingParams

    base = ServingParams()
    rate, bw, k, n, e, h = 1e11, 1e10, 4096, 8192, 0.6, 20.0
    rows = np.asarray([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], float)
    nbytes = (k * n + rows * (k + n)) * 4
    t = np.maximum(2 * rows * k * n / rate / e * (1 + h / rows), nbytes / bw * (1 + base.memory_bytes_half / nbytes))
    mb = {"gemm_sweep": {"k": k, "n": n, "dtype": "float32", "rows": rows.astype(int).tolist(),
                         "seconds": t.tolist()},
          "matmul_flops_per_s": rate, "stream_bytes_per_s": bw, "kernel_overhead_s": 0.0}
    fit = fit_gemm_curve(mb, base)
    assert fit["gemm_efficiency_max"] == pytest.approx(e, abs=0.02)
    assert fit["gemm_rows_half"] == pytest.approx(h, rel=0.1)
    assert max(abs(np.log(fit["predicted_over_measured"]))) < 0.05


@pytest.mark.parametrize("batches,prefill", [((1,), 512), ((1, 8), 512), ((2,), 32), ((3, 64), 128), ((8,), 8)])
def test_each_decode_batch_gets_a_curve_fitted_around_its_own_rows(batches, prefill):
    from codesign.device_bench import phase_rows, step_key, sweep_rows

    rows = sweep_rows(batches, prefill)
    ranges = phase_rows(batches, prefill)
    assert set(ranges) == {f"decode B={b}" for b in batches} | {"prefill", "run"}
    for b in batches:
        lo, hi = ranges[step_key("decode", b)]
        inside = [m for m in rows if lo <= m <= hi]
        assert b in inside and len(inside) >= 2, (b, inside)  # the step's own row count and a neighbour
    assert ranges[step_key("prefill", prefill)] == (prefill / 4, prefill)
