"""Samplers and the new axes of the design space: Sobol' / Latin-hypercube points stay in their ranges, are
deterministic in the seed and stratified as the method promises; clock and HBM speed follow their closed forms and
their generation's limits."""

import numpy as np
import pytest

from arch_space.design_space import AXES, INTEGER_AXES, DesignSpace, chip_columns, derive_chips
from arch_space.errors import ConfigError
from arch_space.technology import Generation
from conftest import load_yaml


def gen(name="gen2"):
    return Generation.from_dict(load_yaml(f"generation/{name}.yaml"), f"generation.{name}")


def sampled(sampler, n=256, seed=0, **over):
    data = load_yaml("space/sobol.yaml") | {"sampler": sampler, "samples": n, "seed": seed} | over
    return DesignSpace.from_dict(data)


@pytest.mark.parametrize("sampler", ["sobol", "lhs"])
def test_samples_stay_in_range_and_integers_stay_whole(sampler):
    space = sampled(sampler, 512)
    pts = space.points()
    assert set(pts) == set(AXES) and all(len(v) == 512 for v in pts.values())
    for a, (lo, hi) in space.bounds().items():
        assert pts[a].min() >= lo and pts[a].max() <= hi, a
        if a in INTEGER_AXES:
            assert np.all(pts[a] == np.round(pts[a])), a
    # every whole number of an integer range is drawn (1..4 dies, 4..16 stacks)
    assert set(pts["compute_dies"]) == {1.0, 2.0, 3.0, 4.0}
    assert set(pts["hbm_stacks"]) == set(np.arange(4.0, 17.0))
    assert np.all(pts["scaleup_domain_chips"] == 64)  # one value: held fixed


@pytest.mark.parametrize("sampler", ["sobol", "lhs"])
def test_samples_are_deterministic_in_the_seed(sampler):
    a, b, c = sampled(sampler, seed=3).points(), sampled(sampler, seed=3).points(), sampled(sampler, seed=4).points()
    assert all(np.array_equal(a[k], b[k]) for k in AXES)
    assert not np.array_equal(a["power_rating_w"], c["power_rating_w"])


def test_latin_hypercube_hits_every_stratum_once():
    n = 200
    space = sampled("lhs", n)
    pts = space.points()
    for a in ("sram_area_fraction", "power_rating_w", "clock_scale"):
        lo, hi = space.bounds()[a]
        strata = np.floor((pts[a] - lo) / (hi - lo) * n).astype(int)
        assert sorted(strata) == list(range(n)), a  # McKay et al.: one point per 1/n slice of each axis


def test_sobol_fills_the_space_more_evenly_than_random():
    # discrepancy of the 2-D projection (sram fraction, power): scrambled Sobol' below i.i.d. uniform points
    from scipy.stats import qmc

    space = sampled("sobol", 1024)
    pts = space.points()
    b = space.bounds()
    u = np.stack([(pts[a] - b[a][0]) / (b[a][1] - b[a][0]) for a in ("sram_area_fraction", "power_rating_w")], 1)
    rnd = np.random.default_rng(0).uniform(size=u.shape)
    assert qmc.discrepancy(u) < 0.5 * qmc.discrepancy(rnd)


@pytest.mark.parametrize("over,field", [
    ({"samples": None}, "space.samples"),
    ({"power_rating_w": [500, 1000, 2000]}, "space.power_rating_w"),
    ({"power_rating_w": [2000, 500]}, "space.power_rating_w"),
    ({"sampler": "halton"}, "space.sampler"),
])
def test_bad_sampled_space_is_one_clear_error(over, field):
    with pytest.raises(ConfigError) as ei:
        sampled("sobol", **over) if "sampler" not in over else DesignSpace.from_dict(
            load_yaml("space/sobol.yaml") | over)
    assert str(ei.value).startswith(field) and "\n" not in str(ei.value)


def test_grid_takes_no_samples():
    with pytest.raises(ConfigError, match=r"^space.samples"):
        DesignSpace.from_dict(load_yaml("space/smoke.yaml") | {"samples": 10})


def one(**kw):
    base = dict(compute_dies=2, sram_area_fraction=0.2, clock_scale=1.0, hbm_stacks=8, hbm_speed_scale=1.0,
                power_rating_w=2000.0, scaleup_bandwidth_bytes_per_s=9e11, scaleup_domain_chips=64)
    return {k: np.asarray([float(v)]) for k, v in (base | kw).items()}


def test_clock_scales_rate_linearly_and_energy_quadratically():
    g = gen()
    a = chip_columns(g, one(), np)
    b = chip_columns(g, one(clock_scale=1.1), np)
    assert b["_fp4_array_flops_per_s"][0] == pytest.approx(1.1 * a["_fp4_array_flops_per_s"][0], rel=1e-12)
    assert b["fp8_energy_j_per_flop"][0] == pytest.approx(1.21 * a["fp8_energy_j_per_flop"][0], rel=1e-12)
    # the power-capped rate falls as 1 / clock^2: at a low rating a faster clock buys nothing
    lo_a = chip_columns(g, one(power_rating_w=400.0), np)
    lo_b = chip_columns(g, one(power_rating_w=400.0, clock_scale=1.1), np)
    assert lo_b["fp4_flops_per_s"][0] == pytest.approx(lo_a["fp4_flops_per_s"][0] / 1.21, rel=1e-12)


def test_hbm_speed_bin_scales_bandwidth_and_price():
    g = gen()
    a, b = chip_columns(g, one(), np), chip_columns(g, one(hbm_speed_scale=1.1), np)
    assert b["hbm_bandwidth_bytes_per_s"][0] == pytest.approx(1.1 * 8 * g.hbm_stack_bandwidth_bytes_per_s)
    hbm = 8 * g.hbm_stack_capacity_bytes * g.hbm_usd_per_byte
    assert b["_chip_cost_usd"][0] - a["_chip_cost_usd"][0] == pytest.approx(hbm * (1.1**0.5 - 1.0), rel=1e-9)


def test_clock_and_hbm_speed_beyond_the_generation_are_infeasible():
    g = gen()
    d = derive_chips(g, one(clock_scale=1.3))
    assert not d.feasible[0] and "clock_scale 1.3" in d.reason[0]
    top = g.hbm_stack_bandwidth_max_bytes_per_s / g.hbm_stack_bandwidth_bytes_per_s
    assert derive_chips(g, one(hbm_speed_scale=top)).feasible[0]
    d = derive_chips(g, one(hbm_speed_scale=top * 1.01))
    assert not d.feasible[0] and "fastest HBM4E bin" in d.reason[0]


def test_chip_columns_agree_in_numpy_and_jax():
    import jax.numpy as jnp

    g = gen("gen3")
    p = sampled("sobol", 64).points()
    a = chip_columns(g, p, np)
    b = chip_columns(g, {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}, jnp)
    for k in a:
        np.testing.assert_allclose(np.asarray(b[k]), a[k], rtol=2e-6, err_msg=k)
