"""The frontier read the other way (codesign.fidelity.read_interactivity_at): the interactivity at which a row's
mappings deliver its measured throughput, the error at matched throughput that validate reports beside the
throughput error of every row at an interactivity."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from codesign.cli import CONF_DIR
from codesign.fidelity import Predictor, read_interactivity_at
from codesign.reference import row_spec
from codesign.validate import validate_rows
from conftest import load_yaml
from serving.perf import ServingParams


def grid(xs, ys, codes=None):
    x, y = np.asarray(xs, np.float32), np.asarray(ys, np.float32)
    return {"interactivity_tok_s_user": jnp.asarray(x), "total_tok_s_per_chip": jnp.asarray(y),
            "infeasible_code": jnp.asarray(np.zeros(x.shape, np.int32) if codes is None else codes)}


# two mappings over four concurrencies; mapping B's last point is infeasible (its KV does not fit)
X = [[100, 80, 60, 40], [120, 90, 50, 30]]
Y = [[10, 20, 40, 80], [5, 15, 30, 100]]
CODES = np.asarray([[0, 0, 0, 0], [0, 0, 0, 3]], np.int32)


@pytest.mark.parametrize("value, want", [
    (30.0, 70.0),   # A crosses 30 halfway from (80, 20) to (60, 40): 70; B reaches it exactly at 50
    (3.0, 120.0),   # both deliver it at their first concurrency: the faster of the two, B's 120
    (50.0, 55.0),   # A: a quarter of the way from (60, 40) to (40, 80); B only at its infeasible point
    (90.0, -math.inf),  # A tops out at 80; B's 100 is infeasible
])
def test_the_inverse_read_interpolates_each_mapping_and_takes_the_fastest(value, want):
    got = float(read_interactivity_at(grid(X, Y, CODES), value))
    assert got == pytest.approx(want, rel=1e-6) if math.isfinite(want) else got == want


def test_with_every_point_feasible_the_last_segment_counts():
    # B's (30, 100) now counts: 50 -> 44.3 on B, 55 on A
    assert float(read_interactivity_at(grid(X, Y), 50.0)) == pytest.approx(55.0)
    assert float(read_interactivity_at(grid(X, Y), 90.0)) == pytest.approx(50 + (90 - 30) / 70 * (30 - 50))


def spec(value, interactivity=100.0, metric="total_tput_per_chip_at_interactivity"):
    raw = dict(id="inv-1", model="llama3_70b", hardware="b200", precision="fp4", chips="8", mapping="best",
               isl="1024", osl="1024", input_dist="uniform_0.8_1.0", speculative="none", metric=metric,
               interactivity="" if interactivity is None else f"{interactivity:g}", value=f"{value:.9g}",
               unit="total tok/s per chip", confidence="synthetic", source="test")
    predictor = Predictor(CONF_DIR)
    return predictor, raw, row_spec(raw, 2, predictor.models, predictor.hardware)


def test_a_measured_value_equal_to_the_prediction_reads_back_the_rows_interactivity():
    """Forward (read_metric: throughput at the target, best mapping) and inverse (interactivity at that
    throughput, best mapping) are separate code; on monotone curves each undoes the other."""
    params = ServingParams.from_dict(load_yaml("serving/calibrated.yaml"))
    predictor, _, s = spec(1.0)
    predicted = float(predictor.predict(s, params)[0])
    predictor, _, s = spec(predicted)
    value, _, _, x_at = predictor.predict_row(s, params)
    assert float(value) == pytest.approx(predicted, rel=1e-6)  # the measured value does not move the prediction
    assert x_at == pytest.approx(100.0, rel=1e-3)


def test_validate_reports_the_interactivity_error_with_the_sign_of_the_throughput_error():
    params = ServingParams.from_dict(load_yaml("serving/calibrated.yaml"))
    predictor, _, s = spec(1.0)
    predicted = float(predictor.predict(s, params)[0])
    rows, specs = [], []
    for v in (0.5 * predicted, 2.0 * predicted, 1e9):  # model too fast, too slow, a throughput it never reaches
        _, raw, sp = spec(v)
        rows.append(raw)
        specs.append(sp)
    _, raw, sp = spec(1000.0, interactivity=None, metric="max_output_tput_per_chip")
    rows.append(raw)
    specs.append(sp)
    fast, slow, never, offline = validate_rows(predictor, params, rows, specs)
    assert float(fast["error_pct"]) == pytest.approx(100.0, rel=1e-4)
    assert float(fast["interactivity_at_value"]) > 100.0 and float(fast["interactivity_error_pct"]) > 0
    assert float(slow["interactivity_at_value"]) < 100.0 and float(slow["interactivity_error_pct"]) < 0
    assert float(fast["interactivity_error_pct"]) == pytest.approx(float(fast["interactivity_at_value"]) - 100.0,
                                                                   abs=0.01)
    assert never["interactivity_at_value"] == "" and never["interactivity_error_pct"] == ""
    assert never["predicted"]  # its throughput at the target is still predicted; only the inverse has no point
    assert offline["interactivity_at_value"] == "" and offline["interactivity_error_pct"] == ""


def test_the_cross_validation_summary_adds_the_interactivity_error_when_rows_have_one():
    from codesign.calibrate import cv_summary

    def rec(fold, err, inter=""):
        return dict(fold=fold, error_pct=str(err), interactivity_error_pct=inter)

    records = [rec("setup=a", 40, "-4"), rec("setup=a", -10, "2"), rec("setup=b", 5), rec("setup=b", 1, "30")]
    lines = cv_summary(records).splitlines()
    assert "median |error|  25.0%" in lines[1] and "(2 rows)" in lines[1]  # fold a: |40|, |-10|
    assert "median |error|   7.5%" in lines[-2] and "(4 rows)" in lines[-2]  # all: 1, 5, 10, 40
    assert lines[-1].lstrip().startswith("interactivity at the measured throughput")
    assert "median |error|   4.0%" in lines[-1] and "(3 rows)" in lines[-1]  # 2, 4, 30
    assert "interactivity" not in cv_summary([rec("setup=a", 3), rec("setup=b", 4)])
