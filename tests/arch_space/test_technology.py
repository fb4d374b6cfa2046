"""Technology model and design space: figures trace to sources, Gen 1 reproduces its public figures, the
cost and yield formulas match technology.md's worked numbers, and infeasible designs carry reasons."""

import math

import numpy as np
import pytest

from arch_space.design_space import AXES, DesignSpace, derive_chips, design_ids
from arch_space.errors import ConfigError
from arch_space.technology import Generation
from conftest import load_yaml

GENS = ("gen1", "gen2", "gen3")


def gen(name):
    return Generation.from_dict(load_yaml(f"generation/{name}.yaml"), f"generation.{name}")


def one(**kw):
    base = dict(compute_dies=1, sram_area_fraction=0.1784, hbm_stacks=6, power_rating_w=700.0,
                scaleup_bandwidth_bytes_per_s=8e11, scaleup_domain_chips=64)
    base.update(kw)
    return {k: np.asarray([float(v)]) for k, v in base.items()}


@pytest.mark.parametrize("name", GENS)
def test_every_figure_has_a_source(name):
    g = gen(name)
    for field, prov in g.provenance.items():
        assert prov.kind in ("datasheet", "measured", "reported", "projected", "derived", "assumed")
        assert len(prov.source) > 10, field


def test_gen1_reproduces_public_figures_within_5_percent():
    d = derive_chips(gen("gen1"), one())
    c = d.chips
    assert d.feasible[0]
    assert float(c.fp4_flops_per_s[0]) == pytest.approx(13.4e15, rel=0.05)
    assert float(c.hbm_bandwidth_bytes_per_s[0]) == pytest.approx(15.4e12, rel=0.05)
    assert float(c.power_rating_w[0]) == 700.0
    # and agrees with the jalapeno_gen1 preset's assumed SRAM
    assert float(c.sram_capacity_bytes[0]) == pytest.approx(256 * 2**20, rel=0.01)


def test_yield_and_cost_match_technology_md_worked_numbers():
    g = gen("gen1")  # D0 = 0.07 /cm^2, $20k wafers
    a = 840e-6
    assert g.dies_per_wafer(a) == pytest.approx(61, abs=1.0)  # "DPW ~ 61 gross"
    assert g.die_yield(a) == pytest.approx(0.585, abs=0.002)  # "0.585 at D0 = 0.07"
    assert g.good_die_cost_usd(a) == pytest.approx(560, rel=0.02)  # "$560"


def test_capital_recovery_factor_closed_form():
    g = gen("gen1")
    r, n = 0.11, 4.5
    assert g.capital_recovery_factor() == pytest.approx(r * (1 + r) ** n / ((1 + r) ** n - 1))


def test_generations_improve_density_and_energy():
    g1, g2, g3 = (gen(n) for n in GENS)
    assert g1.fp4_flops_per_s_per_m2 < g2.fp4_flops_per_s_per_m2 < g3.fp4_flops_per_s_per_m2
    assert g1.fp4_energy_j_per_flop > g2.fp4_energy_j_per_flop > g3.fp4_energy_j_per_flop
    assert g1.hbm_stack_bandwidth_bytes_per_s < g2.hbm_stack_bandwidth_bytes_per_s <= g3.hbm_stack_bandwidth_bytes_per_s


def test_infeasible_designs_carry_reasons():
    g = gen("gen1")
    d = derive_chips(g, one(compute_dies=2))
    assert not d.feasible[0] and "compute_dies" in d.reason[0]
    d = derive_chips(g, one(hbm_stacks=8))  # one die has shoreline for 6 stacks
    assert not d.feasible[0] and "shoreline" in d.reason[0]
    d = derive_chips(g, one(power_rating_w=5000))
    assert not d.feasible[0] and "cooling envelope" in d.reason[0]
    d = derive_chips(g, one(), max_chip_cost_usd=100.0)
    assert not d.feasible[0] and "cost" in d.reason[0]


def test_power_rating_caps_the_clock():
    g = gen("gen2")
    lo = derive_chips(g, one(compute_dies=2, power_rating_w=300, sram_area_fraction=0.1))
    hi = derive_chips(g, one(compute_dies=2, power_rating_w=2000, sram_area_fraction=0.1))
    assert lo.power_limited[0] and not hi.power_limited[0]
    # the capped rate is exactly (rating - static) / energy per FLOP
    expect = 300 * (1 - g.static_power_fraction) / g.fp4_energy_j_per_flop
    assert float(lo.chips.fp4_flops_per_s[0]) == pytest.approx(expect, rel=1e-9)


def test_design_ids_are_stable_and_order_free():
    space = DesignSpace.from_dict(load_yaml("space/smoke.yaml"))
    grid = space.grid()
    ids = design_ids("gen2", grid)
    perm = np.arange(len(ids))[::-1]
    ids_perm = design_ids("gen2", {a: grid[a][perm] for a in AXES})
    assert ids_perm == ids[::-1]
    assert len(set(ids)) == len(ids) == space.size
    assert design_ids("gen3", grid) != ids


@pytest.mark.parametrize("bad,field", [
    ({"hbm_stacks": [6, -1]}, "space.hbm_stacks[1]"),
    ({"sram_area_fraction": [1.5]}, "space.sram_area_fraction[0]"),
    ({"compute_dies": [1.5]}, "space.compute_dies[0]"),
    ({"power_rating_w": [float("nan")]}, "space.power_rating_w[0]"),
    ({"hbm_stacks": []}, "space.hbm_stacks"),
    ({"bogus": [1]}, "space.bogus"),
])
def test_bad_space_is_one_clear_error(bad, field):
    data = load_yaml("space/smoke.yaml") | bad
    with pytest.raises(ConfigError) as ei:
        DesignSpace.from_dict(data)
    assert str(ei.value).startswith(field)
    assert "\n" not in str(ei.value)


def test_bad_generation_figure_is_rejected():
    data = load_yaml("generation/gen2.yaml")
    data["hbm_stack_bandwidth_bytes_per_s"] = -3.6e12
    with pytest.raises(ConfigError, match=r"generation.hbm_stack_bandwidth_bytes_per_s: must be > 0, got -3600000000000.0"):
        Generation.from_dict(data)
    data = load_yaml("generation/gen2.yaml")
    del data["provenance"]["wafer_price_usd"]
    with pytest.raises(ConfigError, match="provenance.wafer_price_usd"):
        Generation.from_dict(data)
    assert math.isfinite(gen("gen2").capital_recovery_factor())
