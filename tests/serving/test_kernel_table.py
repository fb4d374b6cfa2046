"""The kernel table's cost coefficients against traces it was not fitted on and closed-form lm_head costs.

Oracles: a full-size trace of the real model at a prompt length outside the three the table is solved from (an
independent evaluation of the same operator graph, not the table), and the published Llama 3 8B shape (models.md:
hidden 4096, vocab 128256, untied lm_head), whose head costs 2 x hidden x vocab FLOPs per row it runs on.
"""

import numpy as np
import pytest

from serving.architecture import ModelArchitecture
from serving.graph import trace_step
from serving.kernel_table import PREFILL_T0, build_kernel_table
from serving.models import build_model
from serving.perf import Mapping, Work, kernel_times
from serving.precision import Precision
from conftest import load_yaml

H, V = 4096, 128256  # Llama 3 8B (models.md)


def _setup(name="llama3_8b", precision="fp8"):
    arch = ModelArchitecture.from_dict(load_yaml(f"workload/{name}.yaml"))
    prec = Precision.from_dict(load_yaml(f"precision/{precision}.yaml"))
    return arch, prec, build_kernel_table(arch, prec)


def _prefill_flops(kt, requests, length):
    """The table's prefill matmul FLOPs of ``requests`` prompts of ``length`` tokens (all kernels, all dtypes)."""
    per = (kt.p_flops_r * requests + kt.p_flops_t * requests * length
           + kt.p_flops_tt * requests * length * length).sum(axis=1)
    return float((per * kt.count).sum())


@pytest.mark.parametrize("name", ["llama3_8b", pytest.param("qwen3_30b_a3b", marks=pytest.mark.slow)])
def test_prefill_coefficients_reproduce_a_trace_at_an_unfitted_length(name):
    arch, prec, kt = _setup(name)
    t = 3 * PREFILL_T0  # between the fitted 2 T0 and 4 T0
    g = trace_step(build_model(arch), arch, "prefill", 1, t, t, prec)
    # (the table halves nothing: the T^2 term is the full masked square as traced; the evaluator skips blocks)
    assert _prefill_flops(kt, 1, t) == pytest.approx(g.totals()["matmul_flops"], rel=1e-6)


def test_lm_head_runs_once_per_prompt_not_per_prompt_token():
    _, _, kt = _setup()
    head = list(kt.names).index("lm_head")
    assert kt.p_flops_r[head].sum() == pytest.approx(2 * H * V)  # the last position only
    assert kt.p_flops_t[head].sum() == 0 and kt.p_flops_tt[head].sum() == 0
    assert kt.d_flops_b[head].sum() == pytest.approx(2 * H * V)  # decode: every token is sampled
    # no other kernel has a per-request term: everything else runs on every prompt token
    others = np.delete(kt.p_flops_r.sum(axis=1), head)
    assert np.all(others == 0)


def test_evaluated_prefill_flops_match_the_closed_form():
    """Prefill FLOPs as the serving model evaluates them (kernel_times) against Llama 3 8B by hand: every linear
    weight once per prompt token, causal attention over i keys for the i-th token (QK^T and PV: 2 x 2 x q width
    per pair, the evaluator's block-skipping count of T^2 / 2 pairs), and the lm_head once per prompt."""
    from arch_space.chip import Chip
    from serving.perf import ServingParams

    _, _, kt = _setup()
    chip = Chip.from_dict(load_yaml("hardware/h100_sxm.yaml"), "h100_sxm")
    params = ServingParams.from_dict(load_yaml("serving/default.yaml"))
    layers, qd, kvd, ffn = 32, 4096, 1024, 14336
    linear = layers * (H * (qd + 2 * kvd) + qd * H + 3 * H * ffn)
    for requests, length in ((1, 1024), (2, 1024), (1, 8192), (3, 2048)):
        w = Work(decode_tokens=0.0, decode_queries=1.0, context=0.0, prefill_requests=float(requests),
                 prefill_len=float(length))
        got = float(kernel_times(chip, kt, params, Mapping(), w)["flops_by_dtype"].sum())
        want = requests * (2 * linear * length + layers * 2 * 2 * qd * length * length / 2 + 2 * H * V)
        assert got == pytest.approx(want, rel=1e-4), (requests, length)
