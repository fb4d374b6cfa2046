"""A chip (one accelerator package in its scale-up system) as a JAX pytree.

All numeric fields are SI, with the unit in the name, and are pytree *leaves*: a batch of N candidate designs is one
:class:`Chip` whose leaves are arrays of shape ``[N]``, which is what the serving model ``jax.vmap``s over. Identity
fields (``name``, ``vendor``) and the provenance table are static metadata, so they never enter a trace.

Conventions:

- Math rates are *dense* peak rates (no sparsity). ``None`` in a preset means "not supported / not published"; it is
  stored as ``0.0`` and :meth:`Chip.math_rate` falls back to the next supported rate (FP4 weights on a chip without
  FP4 math are computed at the FP8 rate, then BF16), as the reference methodology prescribes.
- Optional figures that are unknown (area, cost, all-in power) are also stored as ``0.0``; :meth:`Chip.known` tells
  them apart from real values and reports show them as n/a.
- Scale-up bandwidth is per chip, per direction.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from arch_space.errors import ConfigError
from arch_space.provenance import COMMAND_LINE, Provenance
from arch_space.validation import check_quantity

MATH_DTYPES = ("bf16", "fp8", "int8", "fp4")

# Fallback order when a dtype has no native math: the next *wider* supported format (reference README, precision).
_FALLBACK = {"fp4": ("fp4", "fp8", "bf16"), "int8": ("int8", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",)}

# field name -> (required, allow_zero, integer, doc)
NUMERIC_FIELDS: dict[str, tuple[bool, bool, bool, str]] = {
    "bf16_flops_per_s": (False, False, False, "dense BF16 tensor math rate"),
    "fp8_flops_per_s": (False, False, False, "dense FP8 tensor math rate"),
    "int8_flops_per_s": (False, False, False, "dense INT8 tensor math rate (ops/s)"),
    "fp4_flops_per_s": (False, False, False, "dense FP4 (MXFP4/NVFP4) tensor math rate"),
    "sram_capacity_bytes": (True, False, False, "on-chip SRAM usable for weights / KV / state"),
    "sram_bandwidth_bytes_per_s": (True, False, False, "aggregate on-chip SRAM read bandwidth"),
    "hbm_capacity_bytes": (True, False, False, "HBM capacity per chip"),
    "hbm_bandwidth_bytes_per_s": (True, False, False, "HBM bandwidth per chip"),
    "scaleup_bandwidth_bytes_per_s": (True, False, False, "scale-up link bandwidth per chip, per direction"),
    "scaleup_latency_s": (True, False, False, "one-hop latency of a scale-up transfer"),
    "scaleup_domain_chips": (True, False, True, "chips in one scale-up domain"),
    "scaleout_bandwidth_bytes_per_s": (True, False, False, "scale-out (NIC) bandwidth per chip, per direction"),
    "power_rating_w": (True, False, False, "chip power rating (TDP / TBP)"),
    "idle_power_w": (True, False, False, "static power with no work"),
    "allin_power_w": (False, False, False, "all-in provisioned power per chip (InferenceX all-in kW)"),
    "die_area_m2": (False, False, False, "total logic die area in the package"),
    "rental_usd_per_s": (False, False, False, "rental / TCO cost per chip-second"),
    # Dynamic energies for the power model (serving/power.py): FP8 tensor math per FLOP (BF16 2x, FP4 0.5x, INT8
    # 1x: the 4:2:1 rule of technology.md §2.4), HBM and SRAM traffic per byte, scale-up link traffic per byte.
    "fp8_energy_j_per_flop": (True, False, False, "dynamic energy of a dense FP8 FLOP"),
    "hbm_energy_j_per_byte": (True, False, False, "HBM access energy per byte moved"),
    "sram_energy_j_per_byte": (True, False, False, "on-chip SRAM access energy per byte"),
    "link_energy_j_per_byte": (True, False, False, "scale-up link energy per byte sent"),
    # The placement knob of the custom-chip disclosure: the share of SRAM under explicit software placement
    # (weights / KV pinned there and so not needing HBM capacity). 1 for scratchpad designs, 0 for a hardware-managed
    # cache (a GPU L2 only serves a step's resident bytes when they all fit, and adds no capacity).
    "sram_explicit_fraction": (True, True, False, "share of SRAM under explicit placement (0 = cache, 1 = scratchpad)"),
}
# Relative energy per FLOP of each math dtype, FP8 = 1 (technology.md §2.4: BF16 : FP8 : FP4 = 4 : 2 : 1).
ENERGY_PER_FLOP_RELATIVE = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}
STATIC_FIELDS = ("name", "vendor", "provenance")


@dataclasses.dataclass(frozen=True)
class Chip:
    bf16_flops_per_s: Any
    fp8_flops_per_s: Any
    int8_flops_per_s: Any
    fp4_flops_per_s: Any
    sram_capacity_bytes: Any
    sram_bandwidth_bytes_per_s: Any
    hbm_capacity_bytes: Any
    hbm_bandwidth_bytes_per_s: Any
    scaleup_bandwidth_bytes_per_s: Any
    scaleup_latency_s: Any
    scaleup_domain_chips: Any
    scaleout_bandwidth_bytes_per_s: Any
    power_rating_w: Any
    idle_power_w: Any
    allin_power_w: Any = 0.0
    die_area_m2: Any = 0.0
    rental_usd_per_s: Any = 0.0
    fp8_energy_j_per_flop: Any = None  # None only in hand-built test chips; presets and designs always set them
    hbm_energy_j_per_byte: Any = None
    sram_energy_j_per_byte: Any = None
    link_energy_j_per_byte: Any = None
    sram_explicit_fraction: Any = 0.0
    name: str = "unnamed"
    vendor: str = ""
    provenance: tuple = ()  # ((field, Provenance), ...), static

    def energy_per_flop(self, dtype: str):
        return self.fp8_energy_j_per_flop * ENERGY_PER_FLOP_RELATIVE[dtype]

    def executed_energy_per_flop(self, dtype: str):
        """Energy of a FLOP of ``dtype`` math as the chip runs it: at the format :meth:`math_rate` falls back to (FP4
        weights on a chip without FP4 math cost FP8 MACs, not FP4 ones)."""
        return self._as_executed(dtype, self.energy_per_flop)

    # ------------------------------------------------------------------ derived values
    def math_rate(self, dtype: str):
        """Effective dense rate for math in ``dtype``, falling back to the next supported (wider) format."""
        return self._as_executed(dtype, lambda dt: getattr(self, f"{dt}_flops_per_s"))

    def _as_executed(self, dtype: str, value_of):
        """``value_of`` the format ``dtype`` math runs in: ``dtype`` where the chip has a rate for it, else the next
        supported (wider) format of its fallback order (BF16 last, always)."""
        if dtype not in _FALLBACK:
            raise ConfigError("dtype", f"unknown math dtype {dtype!r} (one of {', '.join(MATH_DTYPES)})")
        order = _FALLBACK[dtype]
        value = value_of(order[-1])
        for dt in reversed(order[:-1]):
            value = jnp.where(getattr(self, f"{dt}_flops_per_s") > 0, value_of(dt), value)
        return value

    def native_math(self, dtype: str) -> bool:
        return bool(np.all(np.asarray(getattr(self, f"{dtype}_flops_per_s")) > 0))

    @property
    def peak_flops_per_s(self):
        """Highest dense math rate of any dtype (for display and ridge points)."""
        return jnp.maximum(jnp.maximum(self.bf16_flops_per_s, self.fp8_flops_per_s), self.fp4_flops_per_s)

    def ridge_flops_per_byte(self, dtype: str):
        """Arithmetic intensity where the HBM roofline meets the compute roof (Williams et al., CACM 2009)."""
        return self.math_rate(dtype) / self.hbm_bandwidth_bytes_per_s

    def known(self, field: str) -> bool:
        return bool(np.all(np.asarray(getattr(self, field)) > 0))

    def provenance_of(self, field: str) -> Provenance | None:
        return dict(self.provenance).get(field)

    @property
    def batch_size(self) -> int | None:
        shape = np.shape(self.hbm_bandwidth_bytes_per_s)
        return shape[0] if shape else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data, path: str = "hardware", overridden: tuple[str, ...] = ()) -> "Chip":
        """Validate a preset mapping (SI values plus a ``provenance`` table) and build a Chip.

        ``overridden`` names fields set on the command line: their provenance becomes "assumed, command line".
        """
        if not isinstance(data, dict):
            raise ConfigError(path, f"expected a hardware mapping, got {data!r}")
        known = set(NUMERIC_FIELDS) | set(STATIC_FIELDS) | {"description"}
        for key in data:
            if key not in known:
                raise ConfigError(f"{path}.{key}", "unknown hardware field")
        for key in ("name", "vendor"):
            if not isinstance(data.get(key), str) or not data.get(key):
                raise ConfigError(f"{path}.{key}", f"expected a non-empty string, got {data.get(key)!r}")
        values = {}
        for fname, (required, allow_zero, integer, _doc) in NUMERIC_FIELDS.items():
            v = check_quantity(data.get(fname), f"{path}.{fname}", optional=not required, allow_zero=allow_zero,
                               integer=integer)
            values[fname] = 0.0 if v is None else float(v)
        if not any(values[f"{dt}_flops_per_s"] > 0 for dt in MATH_DTYPES):
            raise ConfigError(f"{path}.bf16_flops_per_s", "a chip needs at least one math rate, all are null")
        if values["sram_explicit_fraction"] > 1:
            raise ConfigError(f"{path}.sram_explicit_fraction", f"must be <= 1, got {values['sram_explicit_fraction']}")
        if values["idle_power_w"] >= values["power_rating_w"]:
            raise ConfigError(f"{path}.idle_power_w",
                              f"must be below power_rating_w ({values['power_rating_w']}), got {values['idle_power_w']}")
        prov_raw = data.get("provenance", {}) or {}
        if not isinstance(prov_raw, dict):
            raise ConfigError(f"{path}.provenance", f"expected a mapping of field -> provenance, got {prov_raw!r}")
        prov = {}
        for fname, entry in prov_raw.items():
            if fname not in NUMERIC_FIELDS:
                raise ConfigError(f"{path}.provenance.{fname}", "provenance for an unknown field")
            prov[fname] = Provenance.from_dict(entry, f"{path}.provenance.{fname}")
        for fname in overridden:
            prov[fname] = COMMAND_LINE
        for fname in NUMERIC_FIELDS:
            if (values[fname] > 0 or (fname == "sram_explicit_fraction" and data.get(fname) is not None)) \
                    and fname not in prov:
                raise ConfigError(f"{path}.provenance.{fname}", "every figure needs a provenance (kind and source)")
        return cls(**values, name=data["name"], vendor=data["vendor"], provenance=tuple(sorted(prov.items())))

    def to_dict(self) -> dict:
        """Plain mapping (floats) for tables and Parquet rows; scalar chips only."""
        return {f: float(getattr(self, f)) for f in NUMERIC_FIELDS} | {"name": self.name, "vendor": self.vendor}

    def replace(self, **changes) -> "Chip":
        return dataclasses.replace(self, **changes)


jax.tree_util.register_dataclass(Chip, data_fields=list(NUMERIC_FIELDS), meta_fields=list(STATIC_FIELDS))


def stack(chips: list[Chip], name: str = "batch") -> Chip:
    """One Chip whose leaves are ``[len(chips)]`` arrays (float64 on the host; JAX casts to its default dtype)."""
    if not chips:
        raise ConfigError("designs", "cannot stack an empty list of chips")
    cols = {f: np.asarray([float(getattr(c, f)) for c in chips], dtype=np.float64) for f in NUMERIC_FIELDS}
    return Chip(**cols, name=name, vendor="", provenance=())


def unstack(batch: Chip) -> list[Chip]:
    n = batch.batch_size
    if n is None:
        return [batch]
    return [Chip(**{f: float(np.asarray(getattr(batch, f))[i]) for f in NUMERIC_FIELDS}, name=f"{batch.name}[{i}]")
            for i in range(n)]
