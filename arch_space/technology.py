"""The technology roadmap: what a process node, a memory generation and a package can deliver, per generation.

A :class:`Generation` holds the figures that turn microarchitecture choices (compute area, SRAM area, HBM stacks,
power rating) into a chip description (``design_space.py``): logic and SRAM density, energy per FLOP, HBM stack
bandwidth / capacity / energy, reticle and package limits, wafer price, defect density, HBM and packaging cost, and
the owned-TCO terms. Every figure carries a :class:`Provenance` (source and kind); the values come from
``../shared/reference/technology.md`` (section numbers in each YAML's provenance). The YAMLs hold the headline
defaults of technology.md section 0 per generation plus the ranges a design may choose within (HBM speed bins up to
the fastest shipping or projected one, clock up to ``max_clock_scale``); ``design_space.py`` enforces them.
"""

from __future__ import annotations

import dataclasses
import math

from arch_space.errors import ConfigError
from arch_space.provenance import Provenance
from arch_space.validation import build, quantity


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str
    label: str
    year: int
    logic_node: str
    hbm_generation: str
    # --- logic die
    reticle_area_m2: float = quantity()
    compute_die_area_m2: float = quantity(doc="area of one (reticle-sized) compute die")
    max_compute_dies: int = quantity(integer=True)
    fp4_flops_per_s_per_m2: float = quantity(doc="dense FP4 rate per m^2 of tensor-array area")
    fp4_energy_j_per_flop: float = quantity(doc="dynamic energy of a dense FP4 FLOP (FP8 2x, BF16 4x)")
    sram_bytes_per_m2: float = quantity(doc="practical on-die SRAM density (with periphery, ECC, NoC)")
    sram_bandwidth_bytes_per_flop: float = quantity(doc="SRAM read bandwidth provisioned per FP4 FLOP/s")
    hbm_phy_area_m2_per_stack: float = quantity()
    fixed_io_area_m2: float = quantity(doc="scale-up / scale-out SerDes, PCIe, control: per compute die")
    static_power_fraction: float = quantity(doc="static + uncore power as a fraction of the rating")
    sram_energy_j_per_byte: float = quantity(doc="global SRAM access energy per byte")
    link_energy_j_per_byte: float = quantity(doc="scale-up SerDes energy per byte")
    # --- memory
    hbm_stack_bandwidth_bytes_per_s: float = quantity()
    hbm_stack_capacity_bytes: float = quantity()
    hbm_energy_j_per_bit: float = quantity()
    hbm_stack_bandwidth_max_bytes_per_s: float = quantity(doc="fastest speed bin of the generation's HBM")
    hbm_price_bandwidth_exponent: float = quantity(allow_zero=True, doc="stack price ~ (bandwidth / nominal)^x")
    max_clock_scale: float = quantity(doc="highest clock / the nominal clock the array density is quoted at")
    max_hbm_stacks: int = quantity(integer=True)
    hbm_stacks_per_die_edge: int = quantity(integer=True, doc="stacks that fit along one long die edge")
    # --- package and system
    max_package_power_w: float = quantity()
    scaleup_latency_s: float = quantity()
    scaleout_bandwidth_bytes_per_s: float = quantity()
    # --- cost and TCO (technology.md sections 1.4, 1.5, 7)
    wafer_price_usd: float = quantity()
    defect_density_per_m2: float = quantity()
    hbm_usd_per_byte: float = quantity()
    packaging_usd: float = quantity()
    system_capex_multiplier: float = quantity(doc="server, network and optics share per chip, x chip cost")
    capex_rate_per_year: float = quantity()
    capex_life_years: float = quantity()
    electricity_usd_per_j: float = quantity()
    allin_power_multiplier: float = quantity(doc="all-in provisioned power / chip rating (host, network, PUE)")
    provenance: dict[str, Provenance] = dataclasses.field(default_factory=dict)
    description: str = ""

    @classmethod
    def from_dict(cls, data, path: str = "generation") -> "Generation":
        if not isinstance(data, dict):
            raise ConfigError(path, f"expected a generation mapping, got {data!r}")
        prov_raw = data.get("provenance") or {}
        if not isinstance(prov_raw, dict):
            raise ConfigError(f"{path}.provenance", f"expected a mapping, got {prov_raw!r}")
        prov = {k: Provenance.from_dict(v, f"{path}.provenance.{k}") for k, v in prov_raw.items()}
        gen = build(cls, {**data, "provenance": {}}, path)
        numeric = [f.name for f in dataclasses.fields(cls) if f.metadata.get("physical")]
        for k in prov:
            if k not in numeric:
                raise ConfigError(f"{path}.provenance.{k}", "provenance for an unknown field")
        for k in numeric:
            if k not in prov:
                raise ConfigError(f"{path}.provenance.{k}", "every figure needs a provenance (kind and source)")
        if gen.compute_die_area_m2 > gen.reticle_area_m2:
            raise ConfigError(f"{path}.compute_die_area_m2",
                              f"{gen.compute_die_area_m2} exceeds the reticle ({gen.reticle_area_m2})")
        if gen.hbm_stack_bandwidth_max_bytes_per_s < gen.hbm_stack_bandwidth_bytes_per_s:
            raise ConfigError(f"{path}.hbm_stack_bandwidth_max_bytes_per_s",
                              f"{gen.hbm_stack_bandwidth_max_bytes_per_s} is below the nominal "
                              f"{gen.hbm_stack_bandwidth_bytes_per_s}")
        if gen.max_clock_scale < 1:
            raise ConfigError(f"{path}.max_clock_scale", f"must be >= 1 (1 = the nominal clock), got {gen.max_clock_scale}")
        if gen.static_power_fraction >= 1:
            raise ConfigError(f"{path}.static_power_fraction", f"must be < 1, got {gen.static_power_fraction}")
        return dataclasses.replace(gen, provenance=prov)

    # ------------------------------------------------------------------ derived figures
    def capital_recovery_factor(self) -> float:
        """CRF(r, L) = r / (1 - (1 + r)^-L): the annual payment that repays capex over L years (technology.md §7)."""
        r, life = self.capex_rate_per_year, self.capex_life_years
        return r / (1.0 - (1.0 + r) ** -life)

    def dies_per_wafer(self, die_area_m2: float) -> float:
        """Gross dies on a 300 mm wafer: pi 150^2 / A - pi 300 / sqrt(2 A), A in mm^2 (LLMCompass, technology.md §1.5)."""
        a_mm2 = die_area_m2 * 1e6
        return math.pi * 150.0**2 / a_mm2 - math.pi * 300.0 / math.sqrt(2.0 * a_mm2)

    def die_yield(self, die_area_m2: float, alpha: float = 3.0) -> float:
        """Negative-binomial yield Y = (1 + A D0 / alpha)^-alpha, alpha = 3 (LLMCompass, technology.md §1.5)."""
        return (1.0 + die_area_m2 * self.defect_density_per_m2 / alpha) ** -alpha

    def good_die_cost_usd(self, die_area_m2: float) -> float:
        return self.wafer_price_usd / (self.dies_per_wafer(die_area_m2) * self.die_yield(die_area_m2))
