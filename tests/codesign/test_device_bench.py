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


def _sweep(rows, seconds, rate, bw, k, n):
    return {"gemm_sweep": {"k": k, "n": n, "dtype": "float32", "rows": list(rows), "seconds": list(seconds)},
            "matmul_flops_per_s": rate, "stream_bytes_per_s": bw, "kernel_overhead_s": 0.0}


def test_anchored_fit_is_exact_at_the_steps_own_rows_where_the_plain_fit_splits_the_difference():
    """XLA:CPU's sweep: M = 1 a bandwidth-bound GEMV, M = 2 on a small-GEMM path at 2.7x its time, which no curve
    of the form e x M / (M + h) follows (at most 2x): anchored at M = 1 the fit matches M = 1 (the closed-form
    streaming time) and leaves the miss at M = 2; unanchored it misses both."""
    from codesign.device_bench import fit_gemm_curve
    from serving.perf import ServingParams

    base = ServingParams()
    rate, bw, k, n = 2e11, 4e10, 4096, 32768

    def t_mem(m):  # the serving model's streaming time of the GEMM's bytes (closed form)
        nbytes = (k * n + m * (k + n)) * 4
        return nbytes / bw * (1 + base.memory_bytes_half / nbytes)

    mb = _sweep([1, 2], [t_mem(1), 2.7 * t_mem(1)], rate, bw, k, n)
    anchored = fit_gemm_curve(mb, base, anchor=1)
    plain = fit_gemm_curve(mb, base)
    assert abs(np.log(anchored["predicted_over_measured"][0])) < 0.01
    assert anchored["anchor"] == 1 and plain["anchor"] is None
    assert abs(np.log(plain["predicted_over_measured"][0])) > 0.05  # what the anchor is for
    # the anchor only breaks ties the window cannot: a representable sweep is fitted as without it
    rows = np.asarray([4, 8, 16], float)
    t = np.maximum(2 * rows * k * n / rate / 0.6 * (1 + 10 / rows), [t_mem(m) for m in rows])
    mb = _sweep(rows.astype(int).tolist(), t.tolist(), rate, bw, k, n)
    assert max(abs(np.log(fit_gemm_curve(mb, base, anchor=8)["predicted_over_measured"]))) < 0.03


def test_references_give_each_step_the_stream_and_the_sweep_rows_of_its_window():
    from codesign.device_refs import References, references, references_bytes

    info = {"platform": "cpu"}
    bench = {"stream_bytes": 2 ** 20, "matmul_size": 64, "repeats": 2}
    refs = references("float32", info, bench, rows=(1, 2, 4, 8, 16))
    assert isinstance(refs, References) and refs.stream_bytes == 2 ** 20 and refs.rows == (1, 2, 4, 8, 16)
    calls, rows = refs.calls(4, 16)
    assert rows == [4, 8, 16] and len(calls) == 4 and calls[0] is refs.stream
    assert [c[1][0].shape[0] for c in calls[1:]] == rows  # each sweep call multiplies its own row count
    got = refs.bench([0.5, 1.0, 2.0, 3.0], rows)
    assert got["stream_bytes_per_s"] == 2 ** 20 / 0.5
    assert got["gemm_sweep"]["rows"] == [4, 8, 16] and got["gemm_sweep"]["seconds"] == [1.0, 2.0, 3.0]
    assert got["gemm_sweep"]["k"] == refs.k and got["gemm_sweep"]["n"] == refs.n
    held = refs.stream[1][1].nbytes + refs.sweep[0][1][1].nbytes
    assert held <= references_bytes(info, bench)


@pytest.mark.parametrize("k_half", [0.0, 150.0, 700.0, 3000.0])
def test_depth_curve_fit_recovers_a_known_depth_penalty(k_half):
    """Times generated in closed form, t(K) = 2 M K N / (rate_inf x K / (K + k_half)), over the sweep's depths: the fit
    returns k_half (to the grid's step, ~1.2%) and rate_inf, and predicts every point."""
    from codesign.device_bench import DEPTHS, fit_depth_curve

    m, n, rate_inf = 256, 1024, 2e11
    k = np.asarray(DEPTHS, float)
    t = 2 * m * k * n / (rate_inf * k / (k + k_half))
    fit = fit_depth_curve({"m": m, "n": n, "k": list(DEPTHS), "seconds": t.tolist()})
    if k_half == 0:
        assert fit["gemm_k_half"] < 1.0
    else:
        assert fit["gemm_k_half"] == pytest.approx(k_half, rel=0.02)
    assert fit["rate_inf_flops_per_s"] == pytest.approx(rate_inf, rel=0.01)
    assert max(abs(np.log(fit["predicted_over_measured"]))) < 0.01


def test_depth_curve_fit_of_a_depth_blind_device_is_flat():
    """A device whose rate does not depend on K (every point at one rate, with +-3% alternating noise) fits a k_half
    far below the sweep's shallowest depth: a small k_half is what 'no depth penalty' looks like."""
    from codesign.device_bench import DEPTHS, fit_depth_curve

    k = np.asarray(DEPTHS, float)
    noise = np.where(np.arange(len(k)) % 2 == 0, 1.03, 0.97)
    t = 2 * 256 * k * 1024 / 2e11 * noise
    fit = fit_depth_curve({"m": 256, "n": 1024, "k": list(DEPTHS), "seconds": t.tolist()})
    assert fit["gemm_k_half"] < 10.0


def test_device_params_predict_a_depth_aware_device_from_its_row_and_depth_sweeps():
    """A synthetic device whose GEMMs run at rate_inf x e M / (M + h) x K / (K + k_half): its row sweep (K = 4096) and
    depth sweep are generated in closed form, fitted as ``execute`` fits them, and the phase-mode parameters then
    predict Llama 3 8B's prefill GEMMs, which contract over 4096 (qkv, o_proj, gate / up) and 14336 (down), at the
    device's own time: FLOPs / rate_inf / e(M) x (1 + k_half x mean(1 / K)). Without the depth fit every kernel
    runs at the sweep's K = 4096 rate, so the MLP (a third of its FLOPs at K = 14336) comes out slower than the
    device by the depth factor's ratio."""
    from codesign.device_bench import DEPTHS, device_params, fit_depth_curve, fit_gemm_curve
    from serving.kernel_table import build_kernel_table
    from serving.perf import Mapping, ServingParams, Work, kernel_times
    from serving.precision import Precision
    from tests.conftest import load_yaml
    from tests.serving.test_serve import arch, chip

    rate_inf, e, h, k_half, rate_sq = 1.0e11, 0.6, 20.0, 400.0, 0.7e11
    k_ref, n = 4096, 8192

    def device_time(m, k, nn):  # the synthetic device, compute-bound
        return 2 * m * k * nn / (rate_inf * e * m / (m + h) * k / (k + k_half))

    rows = np.asarray([64, 128, 256, 512, 1024, 2048], float)
    base = ServingParams(memory_bytes_half=0.0)
    mb = {"gemm_sweep": {"k": k_ref, "n": n, "dtype": "float32", "rows": rows.astype(int).tolist(),
                         "seconds": device_time(rows, k_ref, n).tolist()},
          "matmul_flops_per_s": rate_sq, "stream_bytes_per_s": 1e15, "kernel_overhead_s": 0.0, "dispatch_s": 0.0}
    fit = fit_gemm_curve(mb, base)
    ks = np.asarray(DEPTHS, float)
    depth = fit_depth_curve({"m": 256, "n": 1024, "k": list(DEPTHS), "seconds": device_time(256, ks, 1024).tolist()})
    with_depth, src = device_params(base, mb, "run", fit, depth)
    without, _ = device_params(base, mb, "run", fit)
    assert with_depth.gemm_k_half == depth["gemm_k_half"] and without.gemm_k_half == 0.0
    assert "depth sweep" in src["gemm_k_half"]

    kt = build_kernel_table(arch("llama3_8b"), Precision.from_dict(load_yaml("precision/fp32.yaml")))
    dev = chip(bf16_flops_per_s=rate_sq, fp8_flops_per_s=0.0, hbm_bandwidth_bytes_per_s=1e15,
               sram_bandwidth_bytes_per_s=1e15)
    t_len = 2048.0
    work = Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=1.0, prefill_len=t_len)
    got = kernel_times(dev, kt, with_depth, Mapping(), work)["t_compute"]
    flat = kernel_times(dev, kt, without, Mapping(), work)["t_compute"]
    hid, ffn, layers = 4096, 14336, 32
    truth = {"mlp": layers * (2 * device_time(t_len, hid, ffn) + device_time(t_len, ffn, hid)),
             "o_proj": layers * device_time(t_len, hid, hid)}
    for name, want in truth.items():
        i = kt.names.index(name)
        # the fits' grids (e in steps of 0.02, rows_half log-spaced) leave ~1-2%
        assert float(got[i]) * float(kt.count[i]) == pytest.approx(want, rel=0.03), name
    # between kernels the fits' grid errors cancel: only k_half (the depth fit, ~1%) sets the MLP / o_proj ratio
    ratio = lambda t: float(t[kt.names.index("mlp")]) / float(t[kt.names.index("o_proj")])  # noqa: E731
    assert ratio(got) == pytest.approx(truth["mlp"] / truth["o_proj"], rel=2e-3)
    depth_gain = (1 + k_half / hid) / (1 + k_half * (2 / 3 / hid + 1 / 3 / ffn))  # the MLP's deeper third
    assert ratio(flat) == pytest.approx(ratio(got) * depth_gain, rel=2e-3)
