"""Design spaces: microarchitecture choices per generation, mapped through the technology model to chips.

A candidate design is a point on the axes an architect actually decides: how many reticle-sized compute dies
(chiplets), how much of the die goes to SRAM instead of tensor arrays, the clock relative to the nominal one, how
many HBM stacks and at which speed bin, the package power rating, and the scale-up link bandwidth and domain size.
:func:`derive_chips` turns a batch of such points into a batch :class:`~arch_space.chip.Chip` for one
:class:`~arch_space.technology.Generation`, with area, power and cost, and marks designs that the technology cannot
build as infeasible with the reason (die, package-site or shoreline limits, clock and HBM speed beyond the
generation's, power envelope, cost cap). The floor-plan is deliberately simple and every term is a cited figure:

    usable die area   = dies x die area - stacks x HBM PHY area - dies x fixed I/O area
    SRAM capacity     = usable x sram_area_fraction x SRAM density
    FP4 array rate    = usable x (1 - sram_area_fraction) x FP4 density x clock_scale
    FP4 energy / FLOP = nominal x clock_scale^2            (dynamic energy ~ V^2 with V ~ f in the DVFS range)
    FP4 peak          = min(array rate, (rating - static power) / FP4 energy per FLOP)   (clock capped by power)
    FP8, BF16         = FP4 / 2, FP4 / 4   (the 4:2:1 rate rule of technology.md §2.4: one multiplier array
                                            serves every dtype, so "compute per dtype" follows the FP4 array)
    HBM bandwidth     = stacks x nominal stack bandwidth x hbm_speed_scale

The cost is good-die cost (wafer price / (dies per wafer x yield)) + HBM (priced per byte x speed-bin premium) +
packaging, and the rental-equivalent $/s is the owned-TCO formula of technology.md §7 (capex x CRF + all-in power x
electricity). :func:`chip_columns` is the same arithmetic for any array module, so ``jax.numpy`` can differentiate
a design's serving metrics with respect to its continuous axes (``sweeps/refine.py``).

Samplers (:meth:`DesignSpace.points`): ``grid`` takes every combination of the listed values; ``sobol`` (scrambled
Sobol', Owen 1998) and ``lhs`` (Latin hypercube, McKay et al. 1979) draw ``samples`` points with ``seed``, where an
axis lists either one value (held fixed) or ``[low, high]`` (uniform; integer axes take whole numbers in between).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import warnings

import numpy as np

from arch_space.chip import NUMERIC_FIELDS, Chip
from arch_space.errors import ConfigError
from arch_space.technology import Generation
from arch_space.validation import build, check_quantities, choice, quantity

SECONDS_PER_YEAR = 365.25 * 86400.0
AXES = ("compute_dies", "sram_area_fraction", "clock_scale", "hbm_stacks", "hbm_speed_scale", "power_rating_w",
        "scaleup_bandwidth_bytes_per_s", "scaleup_domain_chips")
INTEGER_AXES = ("compute_dies", "hbm_stacks", "scaleup_domain_chips")
CONTINUOUS_AXES = tuple(a for a in AXES if a not in INTEGER_AXES)
SAMPLERS = ("grid", "sobol", "lhs")
# an axis a caller leaves out (older callers, hand-made points) takes the nominal choice
DEFAULTS = {"clock_scale": 1.0, "hbm_speed_scale": 1.0}


@dataclasses.dataclass(frozen=True)
class DesignSpace:
    name: str
    sampler: str = choice(SAMPLERS, default="grid")
    samples: int | None = quantity(integer=True, optional=True, doc="points drawn by sobol / lhs")
    seed: int = quantity(integer=True, allow_zero=True, default=0)
    compute_dies: tuple[float, ...] = (1,)
    sram_area_fraction: tuple[float, ...] = (0.17,)
    clock_scale: tuple[float, ...] = (1.0,)
    hbm_stacks: tuple[float, ...] = (6,)
    hbm_speed_scale: tuple[float, ...] = (1.0,)
    power_rating_w: tuple[float, ...] = (700.0,)
    scaleup_bandwidth_bytes_per_s: tuple[float, ...] = (9.0e11,)
    scaleup_domain_chips: tuple[float, ...] = (64,)
    max_chip_cost_usd: float | None = quantity(optional=True)
    # gradient refinement (sweeps/refine.py): from the best `refine_top_k` sampled designs of each generation
    refine_top_k: int = quantity(integer=True, allow_zero=True, default=0)
    refine_steps: int = quantity(integer=True, default=30)
    refine_step_size: float = quantity(default=0.05, doc="step in units of each axis's range")
    description: str = ""

    @classmethod
    def from_dict(cls, data, path: str = "space") -> "DesignSpace":
        space = build(cls, data, path)
        for axis in AXES:
            values = check_quantities(getattr(space, axis), f"{path}.{axis}", integer=axis in INTEGER_AXES)
            for i, v in enumerate(values):
                if axis == "sram_area_fraction" and not v < 1:
                    raise ConfigError(f"{path}.{axis}[{i}]", f"must be < 1, got {v!r}")
            if space.sampler != "grid":
                if len(values) > 2:
                    raise ConfigError(f"{path}.{axis}", f"a {space.sampler} space takes one value or [low, high], "
                                                        f"got {len(values)} values")
                if len(values) == 2 and values[0] > values[1]:
                    raise ConfigError(f"{path}.{axis}", f"[low, high] with low <= high, got {list(values)}")
        if space.sampler == "grid" and space.samples is not None:
            raise ConfigError(f"{path}.samples", "only sobol / lhs spaces draw samples (a grid takes every point)")
        if space.sampler != "grid" and space.samples is None:
            raise ConfigError(f"{path}.samples", f"a {space.sampler} space needs the number of points to draw")
        return space

    @property
    def size(self) -> int:
        if self.sampler != "grid":
            return int(self.samples)
        return int(np.prod([len(getattr(self, a)) for a in AXES]))

    def grid(self) -> dict[str, np.ndarray]:
        """All combinations of the axes, as one array per axis (row-major over AXES)."""
        combos = list(itertools.product(*(getattr(self, a) for a in AXES)))
        cols = np.asarray(combos, dtype=np.float64).reshape(len(combos), len(AXES))
        return {a: cols[:, i] for i, a in enumerate(AXES)}

    def bounds(self) -> dict[str, tuple[float, float]]:
        """[low, high] of every axis (the listed extremes of a grid)."""
        return {a: (float(min(getattr(self, a))), float(max(getattr(self, a)))) for a in AXES}

    def points(self) -> dict[str, np.ndarray]:
        """The designs of this space: the full grid, or ``samples`` Sobol' / Latin-hypercube points (deterministic
        in ``seed``)."""
        if self.sampler == "grid":
            return self.grid()
        from scipy.stats import qmc  # a dependency of jax

        varying = [a for a in AXES if len(getattr(self, a)) == 2 and getattr(self, a)[0] != getattr(self, a)[1]]
        n = int(self.samples)
        if varying:
            if self.sampler == "sobol":
                with warnings.catch_warnings():  # balance properties hold for powers of two; any prefix is fine
                    warnings.simplefilter("ignore", UserWarning)
                    u = qmc.Sobol(len(varying), scramble=True, seed=self.seed).random(n)
            else:
                u = qmc.LatinHypercube(len(varying), seed=self.seed).random(n)
        out = {}
        for a in AXES:
            lo, hi = self.bounds()[a]
            if a not in varying:
                out[a] = np.full(n, lo)
                continue
            x = u[:, varying.index(a)]
            if a in INTEGER_AXES:  # whole numbers low ... high, equally likely
                out[a] = np.minimum(np.floor(lo + x * (hi - lo + 1.0)), hi)
            else:
                out[a] = lo + x * (hi - lo)
        return out


def design_ids(generation: str, params: dict[str, np.ndarray]) -> list[str]:
    """Stable id per design: a hash of the generation name and the axis values (not of the row order)."""
    n = len(np.asarray(params["compute_dies"]))
    cols = {a: np.broadcast_to(np.asarray(params[a] if a in params else DEFAULTS[a], np.float64), (n,)).tolist()
            for a in AXES}
    out = []
    for i in range(n):
        key = {"generation": generation} | {a: cols[a][i] for a in AXES}
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


def chip_columns(gen: Generation, p: dict, xp=np) -> dict:
    """Every numeric Chip field of the designs ``p`` (axis -> array), in array module ``xp`` (numpy or jax.numpy),
    plus the derived ``_usable_area_m2``, ``_fp4_array_flops_per_s``, ``_fp4_power_cap_flops_per_s`` and
    ``_chip_cost_usd``."""
    dies, stacks, rating, clock = p["compute_dies"], p["hbm_stacks"], p["power_rating_w"], p["clock_scale"]
    die_area = gen.compute_die_area_m2
    usable = dies * die_area - stacks * gen.hbm_phy_area_m2_per_stack - dies * gen.fixed_io_area_m2
    usable_pos = xp.maximum(usable, 0.0)
    sram_area = usable_pos * p["sram_area_fraction"]
    array_area = usable_pos - sram_area
    fp4_array = array_area * gen.fp4_flops_per_s_per_m2 * clock
    e_fp4 = gen.fp4_energy_j_per_flop * clock**2  # dynamic energy ~ C V^2, V ~ f near nominal (assumed)
    static = gen.static_power_fraction * rating
    fp4_power_cap = (rating - static) / e_fp4
    fp4 = xp.minimum(fp4_array, fp4_power_cap)
    hbm_capacity = stacks * gen.hbm_stack_capacity_bytes
    hbm_cost = hbm_capacity * gen.hbm_usd_per_byte * p["hbm_speed_scale"] ** gen.hbm_price_bandwidth_exponent
    cost = dies * gen.good_die_cost_usd(die_area) + hbm_cost + gen.packaging_usd
    allin = rating * gen.allin_power_multiplier
    rental = (cost * gen.system_capex_multiplier * gen.capital_recovery_factor() / SECONDS_PER_YEAR
              + allin * gen.electricity_usd_per_j)
    ones = xp.ones_like(rating)
    cols = {
        "bf16_flops_per_s": fp4 / 4.0,
        "fp8_flops_per_s": fp4 / 2.0,
        "int8_flops_per_s": fp4 / 2.0,
        "fp4_flops_per_s": fp4,
        "sram_capacity_bytes": sram_area * gen.sram_bytes_per_m2,
        "sram_bandwidth_bytes_per_s": fp4_array * gen.sram_bandwidth_bytes_per_flop,
        "hbm_capacity_bytes": hbm_capacity,
        "hbm_bandwidth_bytes_per_s": stacks * gen.hbm_stack_bandwidth_bytes_per_s * p["hbm_speed_scale"],
        "scaleup_bandwidth_bytes_per_s": p["scaleup_bandwidth_bytes_per_s"] * ones,
        "scaleup_latency_s": gen.scaleup_latency_s * ones,
        "scaleup_domain_chips": p["scaleup_domain_chips"] * ones,
        "scaleout_bandwidth_bytes_per_s": gen.scaleout_bandwidth_bytes_per_s * ones,
        "power_rating_w": rating,
        "idle_power_w": static,
        "allin_power_w": allin,
        "die_area_m2": dies * die_area * ones,
        "rental_usd_per_s": rental,
        "fp8_energy_j_per_flop": 2.0 * e_fp4,  # FP8 = 2 x FP4 (§2.4)
        "hbm_energy_j_per_byte": 8.0 * gen.hbm_energy_j_per_bit * ones,
        "sram_energy_j_per_byte": gen.sram_energy_j_per_byte * ones,
        "link_energy_j_per_byte": gen.link_energy_j_per_byte * ones,
        "sram_explicit_fraction": ones,  # custom designs place weights / KV explicitly (Gen 1 does)
    }
    assert set(cols) == set(NUMERIC_FIELDS)
    return cols | {"_usable_area_m2": usable, "_fp4_array_flops_per_s": fp4_array,
                   "_fp4_power_cap_flops_per_s": fp4_power_cap, "_chip_cost_usd": cost}


def infeasibility(gen: Generation, p: dict[str, np.ndarray], usable: np.ndarray, cost: np.ndarray,
                  max_chip_cost_usd: float | None = None) -> list[str]:
    """Why each design cannot be built ("" where it can), from vectorised checks: only the failing designs pay
    for a message."""
    dies, stacks, rating = p["compute_dies"], p["hbm_stacks"], p["power_rating_w"]
    g = gen
    checks = [
        (dies > g.max_compute_dies, lambda i: f"compute_dies {dies[i]:g} > {g.max_compute_dies} that the {g.name} "
                                              f"package holds"),
        (stacks > g.max_hbm_stacks, lambda i: f"hbm_stacks {stacks[i]:g} > {g.max_hbm_stacks} package HBM sites"),
        (stacks > 2 * g.hbm_stacks_per_die_edge * dies,
         lambda i: f"hbm_stacks {stacks[i]:g} > shoreline of {dies[i]:g} die(s) ({2 * g.hbm_stacks_per_die_edge} "
                   f"per die)"),
        (p["clock_scale"] > g.max_clock_scale * (1 + 1e-12),
         lambda i: f"clock_scale {p['clock_scale'][i]:g} > {g.max_clock_scale:g} the {g.logic_node} design closes at"),
        (p["hbm_speed_scale"] * g.hbm_stack_bandwidth_bytes_per_s > g.hbm_stack_bandwidth_max_bytes_per_s * (1 + 1e-12),
         lambda i: f"hbm_speed_scale {p['hbm_speed_scale'][i]:g} x {g.hbm_stack_bandwidth_bytes_per_s / 1e12:g} TB/s "
                   f"> the fastest {g.hbm_generation} bin ({g.hbm_stack_bandwidth_max_bytes_per_s / 1e12:g} TB/s)"),
        (rating > g.max_package_power_w, lambda i: f"power_rating_w {rating[i]:g} > {g.max_package_power_w:g} W "
                                                   f"cooling envelope"),
        (usable <= 0, lambda i: "HBM PHYs and I/O leave no die area for compute"),
    ]
    if max_chip_cost_usd is not None:
        checks.append((cost > max_chip_cost_usd,
                       lambda i: f"chip cost ${cost[i]:,.0f} > cap ${max_chip_cost_usd:,.0f}"))
    bad = np.zeros(len(rating), bool)
    for mask, _ in checks:
        bad |= mask
    reasons = [""] * len(rating)
    for i in np.flatnonzero(bad):
        reasons[i] = "; ".join(msg(i) for mask, msg in checks if mask[i])
    return reasons


def derive_chips(gen: Generation, params: dict[str, np.ndarray], *, max_chip_cost_usd: float | None = None,
                 name: str = "candidates") -> DerivedDesigns:
    n = len(np.asarray(params["compute_dies"]))
    p = {a: np.broadcast_to(np.asarray(params[a] if a in params else DEFAULTS[a], dtype=np.float64), (n,)).copy() for a in AXES}
    cols = chip_columns(gen, p, np)
    chips = Chip(**{f: cols[f] for f in NUMERIC_FIELDS}, name=name, vendor="candidate", provenance=())
    reasons = infeasibility(gen, p, cols["_usable_area_m2"], cols["_chip_cost_usd"], max_chip_cost_usd)
    feasible = np.asarray([not r for r in reasons], dtype=bool)
    return DerivedDesigns(chips=chips, feasible=feasible, reason=reasons, params=p, chip_cost_usd=cols["_chip_cost_usd"],
                          power_limited=cols["_fp4_power_cap_flops_per_s"] < cols["_fp4_array_flops_per_s"])
