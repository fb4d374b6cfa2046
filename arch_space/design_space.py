"""Design spaces: microarchitecture choices per generation, mapped through the technology model to chips.

A candidate design is a point on a few axes an architect actually decides: how many reticle-sized compute dies,
how much of the die goes to SRAM instead of tensor arrays, how many HBM stacks, the package power rating, and the
scale-up link bandwidth and domain size. :func:`derive_chips` turns a batch of such points into a batch
:class:`~arch_space.chip.Chip` for one :class:`~arch_space.technology.Generation`, with area, power and cost, and
marks designs that the technology cannot build as infeasible with the reason (die or shoreline limits, power
envelope, cost cap). The die floor-plan is deliberately simple and every term is a cited figure:

    usable die area   = dies x die area - stacks x HBM PHY area - dies x fixed I/O area
    SRAM capacity     = usable x sram_area_fraction x SRAM density
    FP4 array rate    = usable x (1 - sram_area_fraction) x FP4 density
    FP4 peak          = min(array rate, (rating - static power) / FP4 energy per FLOP)   (clock capped by power)
    FP8, BF16         = FP4 / 2, FP4 / 4   (the 4:2:1 rate rule of technology.md §2.4)

The cost is good-die cost (wafer price / (dies per wafer x yield)) + HBM + packaging, and the rental-equivalent
$/s is the owned-TCO formula of technology.md §7 (capex x CRF + all-in power x electricity).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json

import numpy as np

from arch_space.chip import NUMERIC_FIELDS, Chip
from arch_space.errors import ConfigError
from arch_space.technology import Generation
from arch_space.validation import build, check_quantities, choice, quantity

SECONDS_PER_YEAR = 365.25 * 86400.0
AXES = ("compute_dies", "sram_area_fraction", "hbm_stacks", "power_rating_w", "scaleup_bandwidth_bytes_per_s",
        "scaleup_domain_chips")
INTEGER_AXES = ("compute_dies", "hbm_stacks", "scaleup_domain_chips")


@dataclasses.dataclass(frozen=True)
class DesignSpace:
    name: str
    sampler: str = choice(("grid",), default="grid")
    compute_dies: tuple[float, ...] = (1,)
    sram_area_fraction: tuple[float, ...] = (0.17,)
    hbm_stacks: tuple[float, ...] = (6,)
    power_rating_w: tuple[float, ...] = (700.0,)
    scaleup_bandwidth_bytes_per_s: tuple[float, ...] = (9.0e11,)
    scaleup_domain_chips: tuple[float, ...] = (64,)
    max_chip_cost_usd: float | None = quantity(optional=True)
    description: str = ""

    @classmethod
    def from_dict(cls, data, path: str = "space") -> "DesignSpace":
        space = build(cls, data, path)
        for axis in AXES:
            values = check_quantities(getattr(space, axis), f"{path}.{axis}", integer=axis in INTEGER_AXES)
            for i, v in enumerate(values):
                if axis == "sram_area_fraction" and not v < 1:
                    raise ConfigError(f"{path}.{axis}[{i}]", f"must be < 1, got {v!r}")
        return space

    @property
    def size(self) -> int:
        return int(np.prod([len(getattr(self, a)) for a in AXES]))

    def grid(self) -> dict[str, np.ndarray]:
        """All combinations of the axes, as one array per axis (row-major over AXES)."""
        combos = list(itertools.product(*(getattr(self, a) for a in AXES)))
        cols = np.asarray(combos, dtype=np.float64).reshape(len(combos), len(AXES))
        return {a: cols[:, i] for i, a in enumerate(AXES)}


def design_ids(generation: str, params: dict[str, np.ndarray]) -> list[str]:
    """Stable id per design: a hash of the generation name and the axis values (not of the row order)."""
    n = len(next(iter(params.values())))
    out = []
    for i in range(n):
        key = {"generation": generation} | {a: float(params[a][i]) for a in AXES}
        out.append(hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16])
    return out


@dataclasses.dataclass(frozen=True)
class DerivedDesigns:
    chips: Chip  # batch, leaves of shape [N]
    feasible: np.ndarray  # bool [N]
    reason: list[str]  # "" where feasible
    params: dict[str, np.ndarray]
    chip_cost_usd: np.ndarray
    power_limited: np.ndarray  # bool: FP4 peak capped by the power rating


def derive_chips(gen: Generation, params: dict[str, np.ndarray], *, max_chip_cost_usd: float | None = None,
                 name: str = "candidates") -> DerivedDesigns:
    p = {a: np.asarray(params[a], dtype=np.float64) for a in AXES}
    dies, stacks, rating = p["compute_dies"], p["hbm_stacks"], p["power_rating_w"]
    die_area = gen.compute_die_area_m2
    usable = dies * die_area - stacks * gen.hbm_phy_area_m2_per_stack - dies * gen.fixed_io_area_m2
    usable_pos = np.maximum(usable, 0.0)
    sram_area = usable_pos * p["sram_area_fraction"]
    array_area = usable_pos - sram_area
    fp4_array = array_area * gen.fp4_flops_per_s_per_m2
    static = gen.static_power_fraction * rating
    fp4_power_cap = (rating - static) / gen.fp4_energy_j_per_flop
    fp4 = np.minimum(fp4_array, fp4_power_cap)
    hbm_capacity = stacks * gen.hbm_stack_capacity_bytes
    cost = (dies * gen.good_die_cost_usd(die_area) + hbm_capacity * gen.hbm_usd_per_byte + gen.packaging_usd)
    allin = rating * gen.allin_power_multiplier
    rental = (cost * gen.system_capex_multiplier * gen.capital_recovery_factor() / SECONDS_PER_YEAR
              + allin * gen.electricity_usd_per_j)
    cols = {
        "bf16_flops_per_s": fp4 / 4.0,
        "fp8_flops_per_s": fp4 / 2.0,
        "int8_flops_per_s": fp4 / 2.0,
        "fp4_flops_per_s": fp4,
        "sram_capacity_bytes": sram_area * gen.sram_bytes_per_m2,
        "sram_bandwidth_bytes_per_s": fp4_array * gen.sram_bandwidth_bytes_per_flop,
        "hbm_capacity_bytes": hbm_capacity,
        "hbm_bandwidth_bytes_per_s": stacks * gen.hbm_stack_bandwidth_bytes_per_s,
        "scaleup_bandwidth_bytes_per_s": p["scaleup_bandwidth_bytes_per_s"],
        "scaleup_latency_s": np.full_like(rating, gen.scaleup_latency_s),
        "scaleup_domain_chips": p["scaleup_domain_chips"],
        "scaleout_bandwidth_bytes_per_s": np.full_like(rating, gen.scaleout_bandwidth_bytes_per_s),
        "power_rating_w": rating,
        "idle_power_w": static,
        "allin_power_w": allin,
        "die_area_m2": dies * die_area,
        "rental_usd_per_s": rental,
        "fp8_energy_j_per_flop": np.full_like(rating, 2.0 * gen.fp4_energy_j_per_flop),  # FP8 = 2 x FP4 (§2.4)
        "hbm_energy_j_per_byte": np.full_like(rating, 8.0 * gen.hbm_energy_j_per_bit),
        "sram_energy_j_per_byte": np.full_like(rating, gen.sram_energy_j_per_byte),
        "link_energy_j_per_byte": np.full_like(rating, gen.link_energy_j_per_byte),
        "sram_explicit_fraction": np.ones_like(rating),  # custom designs place weights / KV explicitly (Gen 1 does)
    }
    assert set(cols) == set(NUMERIC_FIELDS)
    chips = Chip(**cols, name=name, vendor="candidate", provenance=())
    reasons = []
    for i in range(len(rating)):
        r = []
        if dies[i] > gen.max_compute_dies:
            r.append(f"compute_dies {dies[i]:g} > {gen.max_compute_dies} that the {gen.name} package holds")
        if stacks[i] > gen.max_hbm_stacks:
            r.append(f"hbm_stacks {stacks[i]:g} > {gen.max_hbm_stacks} package HBM sites")
        if stacks[i] > 2 * gen.hbm_stacks_per_die_edge * dies[i]:
            r.append(f"hbm_stacks {stacks[i]:g} > shoreline of {dies[i]:g} die(s) "
                     f"({2 * gen.hbm_stacks_per_die_edge} per die)")
        if rating[i] > gen.max_package_power_w:
            r.append(f"power_rating_w {rating[i]:g} > {gen.max_package_power_w:g} W cooling envelope")
        if usable[i] <= 0:
            r.append("HBM PHYs and I/O leave no die area for compute")
        if max_chip_cost_usd is not None and cost[i] > max_chip_cost_usd:
            r.append(f"chip cost ${cost[i]:,.0f} > cap ${max_chip_cost_usd:,.0f}")
        reasons.append("; ".join(r))
    feasible = np.asarray([not r for r in reasons])
    return DerivedDesigns(chips=chips, feasible=feasible, reason=reasons, params=p, chip_cost_usd=cost,
                          power_limited=fp4_power_cap < fp4_array)
