"""Gradient refinement climbs: refined designs stay inside the space and the generation's limits, keep their integer
axes, and, evaluated afresh through the technology and serving models, beat their starting design at the same
operating point without falling below the target interactivity."""

import numpy as np
import pytest

from arch_space.design_space import DesignSpace, derive_chips
from arch_space.chip import NUMERIC_FIELDS, Chip
from arch_space.technology import Generation
from serving.architecture import ModelArchitecture
from serving.kernel_table import build_kernel_table
from serving.perf import Mapping, ServingParams
from serving.precision import Precision
from serving.scenario import Scenario
from serving.serve import evaluate_point, stack_mappings
from sweeps.refine import REFINE_AXES, refine_bounds, refine_designs
from conftest import load_yaml


@pytest.fixture(scope="module")
def setup():
    gen = Generation.from_dict(load_yaml("generation/gen2.yaml"), "generation.gen2")
    space = DesignSpace.from_dict(load_yaml("space/sobol.yaml") | {"samples": 64})
    arch = ModelArchitecture.from_dict(load_yaml("workload/llama3_8b.yaml"))
    kt = build_kernel_table(arch, Precision.from_dict(load_yaml("precision/fp8.yaml")))
    sc = Scenario.from_dict(load_yaml("scenario/inferencex_1k1k.yaml"))
    params = ServingParams.from_dict(load_yaml("serving/calibrated.yaml"))
    pts = space.points()
    d = derive_chips(gen, pts)
    idx = np.flatnonzero(d.feasible)[:3]
    start = {a: v[idx] for a, v in d.params.items()}
    maps = [Mapping(tp=1), Mapping(tp=2), Mapping(tp=1)]
    conc = np.asarray([8.0, 32.0, 64.0], np.float32)
    return gen, space, kt, sc, params, start, maps, conc


def _value(gen, p, i, kt, params, sc, m, c, objective):
    d = derive_chips(gen, {a: v[i:i + 1] for a, v in p.items()})
    chip = Chip(**{f: np.asarray(getattr(d.chips, f))[0] for f in NUMERIC_FIELDS}, name="x")
    out = evaluate_point(chip, kt, params, sc, m, c)
    return float(out[objective]), float(out["interactivity_tok_s_user"]), d.feasible[0]


def test_refinement_improves_each_design_within_bounds(setup):
    gen, space, kt, sc, params, start, maps, conc = setup
    target = 60.0
    out, j0, j1 = refine_designs(gen, space, start, stack_mappings(maps), conc, kt, params, sc, target,
                                 steps=25, step_size=0.05)
    bounds = refine_bounds(gen, space)
    for a in REFINE_AXES:
        lo, hi = bounds[a]
        assert np.all(out[a] >= lo * (1 - 1e-5)) and np.all(out[a] <= hi * (1 + 1e-5)), a
    for a in ("compute_dies", "hbm_stacks", "scaleup_domain_chips"):
        assert np.array_equal(out[a], start[a]), a
    assert np.all(j1 >= j0)
    for i in range(3):
        v0, x0, _ = _value(gen, start, i, kt, params, sc, maps[i], conc[i], "total_tok_s_per_kw")
        v1, x1, feasible = _value(gen, out, i, kt, params, sc, maps[i], conc[i], "total_tok_s_per_kw")
        assert feasible  # the generation's limits hold
        assert v1 > v0 * 1.01  # a real gain, measured by the models themselves, not the climb's own number
        assert x1 >= min(x0, target) * 0.98  # the user experience is held (soft constraint)


def test_refinement_is_deterministic(setup):
    gen, space, kt, sc, params, start, maps, conc = setup
    a = refine_designs(gen, space, start, stack_mappings(maps), conc, kt, params, sc, 60.0, steps=10)[0]
    b = refine_designs(gen, space, start, stack_mappings(maps), conc, kt, params, sc, 60.0, steps=10)[0]
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_bounds_respect_the_generation():
    gen = Generation.from_dict(load_yaml("generation/gen2.yaml"), "generation.gen2")
    space = DesignSpace.from_dict(load_yaml("space/sobol.yaml"))
    b = refine_bounds(gen, space)
    assert b["clock_scale"][1] == gen.max_clock_scale
    assert b["power_rating_w"][1] == min(2500.0, gen.max_package_power_w)
    assert b["hbm_speed_scale"][1] == pytest.approx(
        min(1.15, gen.hbm_stack_bandwidth_max_bytes_per_s / gen.hbm_stack_bandwidth_bytes_per_s))


def test_mix_refinement_weights_workloads(setup):
    gen, space, kt, sc, params, start, maps, conc = setup
    arch_b = ModelArchitecture.from_dict(load_yaml("workload/gpt_oss_20b.yaml"))
    kt_b = build_kernel_table(arch_b, Precision.from_dict(load_yaml("precision/fp8.yaml")))
    m = stack_mappings(maps)
    cc = np.stack([conc, conc])
    # a workload with weight 0 is ignored: the same climb as the first workload alone
    alone = refine_designs(gen, space, start, m, conc, kt, params, sc, 60.0, steps=10)[0]
    masked = refine_designs(gen, space, start, [m, m], cc, [kt, kt_b], params, sc, 60.0, steps=10,
                            weights=np.stack([np.ones(3), np.zeros(3)]))[0]
    assert all(np.allclose(alone[a], masked[a], rtol=1e-5) for a in alone)
    # both weighted: the mix's summed log objective, re-evaluated by the models, improves for every design
    both = refine_designs(gen, space, start, [m, m], cc, [kt, kt_b], params, sc, 60.0, steps=25,
                          weights=np.ones((2, 3)))[0]
    for i in range(3):
        before = sum(np.log(_value(gen, start, i, k, params, sc, maps[i], conc[i], "total_tok_s_per_kw")[0])
                     for k in (kt, kt_b))
        after = sum(np.log(_value(gen, both, i, k, params, sc, maps[i], conc[i], "total_tok_s_per_kw")[0])
                    for k in (kt, kt_b))
        assert after > before
