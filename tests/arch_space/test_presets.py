"""The hardware presets (conf/hardware/*.yaml) against the reference data, and Chip.from_dict on bad input.

The reference CSV lives in the shared folder beside the repository (``<repo>/../shared/reference``); the tests that
need it are skipped when it is absent.
"""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf

from arch_space.chip import NUMERIC_FIELDS, Chip, stack
from arch_space.errors import ConfigError
from arch_space.provenance import KINDS

REPO = Path(__file__).resolve().parents[2]
PRESET_DIR = REPO / "conf" / "hardware"
CSV_PATH = REPO.parent / "shared" / "reference" / "hardware_specs.csv"

# CSV column -> (Chip field, factor to SI)
CSV_COLUMNS = {
    "bf16_dense_tflops": ("bf16_flops_per_s", 1e12),
    "fp8_dense_tflops": ("fp8_flops_per_s", 1e12),
    "fp4_dense_tflops": ("fp4_flops_per_s", 1e12),
    "hbm_gb": ("hbm_capacity_bytes", 1e9),
    "hbm_tb_s": ("hbm_bandwidth_bytes_per_s", 1e12),
    "scaleup_gb_s_per_dir": ("scaleup_bandwidth_bytes_per_s", 1e9),
    "scaleup_domain_chips": ("scaleup_domain_chips", 1.0),
    "tdp_w": ("power_rating_w", 1.0),
    "inferencex_allin_kw": ("allin_power_w", 1e3),
}
CSV_FIELDS = {field for field, _ in CSV_COLUMNS.values()}

# Confidence level -> provenance kind of the CSV figures.
LEVEL_KIND = {"solid": "datasheet", "secondary": "reported", "uncertain": "reported", "public-partial": "reported",
              "projected": "projected"}
# Qualified confidences ("solid-specs/secondary-tdp", "uncertain-tdp", ...): the topic -> fields it covers.
TOPIC_FIELDS = {"tdp": {"power_rating_w"}, "scaleup": {"scaleup_bandwidth_bytes_per_s"},
                "specs": CSV_FIELDS - {"power_rating_w"}}


def expected_kind(confidence: str, field: str) -> str:
    """Provenance kind a CSV figure must carry, from the row's ``confidence`` column."""
    if confidence in LEVEL_KIND:
        return LEVEL_KIND[confidence]
    kind = "datasheet"  # a qualified confidence leaves the unnamed fields solid
    for part in confidence.split("/"):
        level, _, topic = part.partition("-")
        if level not in LEVEL_KIND or topic not in TOPIC_FIELDS:
            raise AssertionError(f"unknown confidence {confidence!r}: teach expected_kind() about it")
        if field in TOPIC_FIELDS[topic]:
            kind = LEVEL_KIND[level]
    return kind


def load_preset(path: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


PRESET_PATHS = sorted(PRESET_DIR.glob("*.yaml"))
PRESET_IDS = [p.stem for p in PRESET_PATHS]


@pytest.fixture(scope="module")
def csv_rows() -> dict[str, dict[str, str]]:
    if not CSV_PATH.is_file():
        pytest.skip(f"reference data not found at {CSV_PATH}")
    with CSV_PATH.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), "duplicate names in hardware_specs.csv"
    return {r["name"]: r for r in rows}


def _csv_values(row: dict[str, str]) -> dict[str, float]:
    return {field: float(row[col]) * scale for col, (field, scale) in CSV_COLUMNS.items() if row[col].strip()}


# ---------------------------------------------------------------- presets vs the reference CSV

def test_preset_set_equals_csv_names(csv_rows):
    assert set(PRESET_IDS) == set(csv_rows)


@pytest.mark.parametrize("path", PRESET_PATHS, ids=PRESET_IDS)
def test_csv_values_match(path, csv_rows):
    data = load_preset(path)
    row = csv_rows[path.stem]
    assert data["name"] == path.stem == row["name"]
    assert data["vendor"] == row["vendor"]
    for field, expected in _csv_values(row).items():
        got = data[field]
        assert got is not None, f"{path.stem}.{field}: the CSV has {expected}, the preset has null"
        assert math.isclose(float(got), expected, rel_tol=1e-12), f"{path.stem}.{field}: {got} != CSV {expected}"


@pytest.mark.parametrize("path", PRESET_PATHS, ids=PRESET_IDS)
def test_csv_provenance_kinds(path, csv_rows):
    data = load_preset(path)
    row = csv_rows[path.stem]
    prov = data["provenance"]
    from_csv = _csv_values(row)
    for field in from_csv:
        entry = prov[field]
        assert entry["kind"] == expected_kind(row["confidence"], field), \
            f"{path.stem}.{field}: kind {entry['kind']!r} for confidence {row['confidence']!r}"
        assert "hardware_specs.csv" in entry["source"], f"{path.stem}.{field}: source must cite hardware_specs.csv"
        if row["confidence"] == "projected":
            assert entry["kind"] == "projected"
    # Figures the CSV lacks: assumed or derived, or a kind backed by another cited source -- never silently the CSV.
    for field, value in data.items():
        if field not in NUMERIC_FIELDS or value is None or field in from_csv:
            continue
        entry = prov[field]
        if entry["kind"] not in ("assumed", "derived"):
            assert not entry["source"].startswith("hardware_specs.csv"), \
                f"{path.stem}.{field}: kind {entry['kind']!r} attributed to the CSV, which has no such figure"
        if entry["kind"] == "assumed":
            assert len(entry["source"]) > 40, f"{path.stem}.{field}: an assumption needs its reasoning in the source"


# ---------------------------------------------------------------- presets on their own

@pytest.mark.parametrize("path", PRESET_PATHS, ids=PRESET_IDS)
def test_preset_builds(path):
    data = load_preset(path)
    chip = Chip.from_dict(data, path=f"hardware[{path.stem}]")
    assert chip.name == path.stem
    assert isinstance(data.get("description"), str) and data["description"].strip()
    assert float(chip.idle_power_w) < float(chip.power_rating_w)
    assert chip.math_rate("bf16") > 0, "every preset needs a BF16 rate (the end of every fallback chain)"


@pytest.mark.parametrize("path", PRESET_PATHS, ids=PRESET_IDS)
def test_preset_fields_and_provenance(path):
    data = load_preset(path)
    missing = set(NUMERIC_FIELDS) - set(data)
    assert not missing, f"{path.stem}: list every field explicitly (null where unknown): {sorted(missing)}"
    prov = data["provenance"]
    for field, (required, _allow_zero, _integer, _doc) in NUMERIC_FIELDS.items():
        value = data[field]
        if value is None:
            assert not required, f"{path.stem}.{field} is required but null"
            assert field not in prov, f"{path.stem}.{field} is null but has a provenance entry"
        else:
            assert field in prov, f"{path.stem}.{field} has no provenance"
            assert prov[field]["kind"] in KINDS
            assert prov[field]["source"].strip()
    assert set(prov) <= set(NUMERIC_FIELDS)
    assert data["idle_power_w"] < data["power_rating_w"]


# Physically sane bounds (SI) for the power-model energies: an order of magnitude or more around technology.md
# section 2 (FP8 ~0.05-0.13 pJ/FLOP, HBM 18-31 pJ/byte, global SRAM 3-5 pJ/byte, SerDes 40-44 pJ/byte).
ENERGY_RANGES = {
    "fp8_energy_j_per_flop": (1e-14, 1e-12),
    "hbm_energy_j_per_byte": (5e-12, 1e-10),
    "sram_energy_j_per_byte": (1e-13, 2e-11),
    "link_energy_j_per_byte": (5e-12, 2e-10),
}


@pytest.mark.parametrize("path", PRESET_PATHS, ids=PRESET_IDS)
def test_preset_energies_sane(path):
    data = load_preset(path)
    prov = data["provenance"]
    for field, (lo, hi) in ENERGY_RANGES.items():
        value = data.get(field)
        assert value is not None, f"{path.stem}.{field}: every preset must set the power-model energies"
        assert lo <= float(value) <= hi, f"{path.stem}.{field} = {value} outside the sane range [{lo}, {hi}]"
        assert prov[field]["kind"] in ("derived", "assumed"), \
            f"{path.stem}.{field}: no vendor publishes this energy, so it is derived or assumed"
        assert "technology.md" in prov[field]["source"], f"{path.stem}.{field}: cite technology.md section 2"
        assert "Rule:" in prov[field]["source"], f"{path.stem}.{field}: state the fleet-wide rule in the source"
    # Energy of a FLOP at each dtype follows the 4:2:1 rule, and SRAM is cheaper per byte than HBM, HBM than a link.
    chip = Chip.from_dict(data)
    fp8 = float(chip.fp8_energy_j_per_flop)
    assert math.isclose(float(chip.energy_per_flop("bf16")), 2 * fp8)
    assert math.isclose(float(chip.energy_per_flop("fp4")), 0.5 * fp8)
    # ... for the format the chip computes in: FP4 math falls back to FP8 (then BF16) where the chip has none
    for dt, ladder in (("fp4", ("fp4", "fp8", "bf16")), ("fp8", ("fp8", "bf16"))):
        runs = next(d for d in ladder if d == "bf16" or float(getattr(chip, f"{d}_flops_per_s") or 0) > 0)
        assert math.isclose(float(chip.executed_energy_per_flop(dt)), {"fp4": 0.5, "fp8": 1.0, "bf16": 2.0}[runs] * fp8,
                            rel_tol=1e-6)  # a float32 jnp.where
    assert chip.sram_energy_j_per_byte < chip.hbm_energy_j_per_byte < chip.link_energy_j_per_byte


# ---------------------------------------------------------------- Chip.from_dict on bad input

def _good() -> dict:
    src = {"kind": "assumed", "source": "test"}
    values = {
        "bf16_flops_per_s": 1.0e15, "fp8_flops_per_s": 2.0e15, "int8_flops_per_s": None, "fp4_flops_per_s": None,
        "sram_capacity_bytes": 5.0e7, "sram_bandwidth_bytes_per_s": 1.0e13, "hbm_capacity_bytes": 8.0e10,
        "hbm_bandwidth_bytes_per_s": 3.35e12, "scaleup_bandwidth_bytes_per_s": 4.5e11, "scaleup_latency_s": 1.0e-6,
        "scaleup_domain_chips": 8, "scaleout_bandwidth_bytes_per_s": 5.0e10, "power_rating_w": 700.0,
        "idle_power_w": 140.0, "allin_power_w": None, "die_area_m2": None, "rental_usd_per_s": None,
        "fp8_energy_j_per_flop": 1.28e-13, "hbm_energy_j_per_byte": 3.12e-11, "sram_energy_j_per_byte": 5.0e-12,
        "link_energy_j_per_byte": 4.4e-11, "sram_explicit_fraction": 0.0,
    }
    return {"name": "test_chip", "vendor": "Test", **values,
            "provenance": {k: dict(src) for k, v in values.items() if v is not None}}


def test_good_dict_builds():
    chip = Chip.from_dict(_good())
    assert chip.hbm_bandwidth_bytes_per_s == 3.35e12
    assert chip.fp4_flops_per_s == 0.0 and not chip.known("fp4_flops_per_s")


@pytest.mark.parametrize("value, shown", [
    (-3.35e12, "-3350000000000.0"),
    (0.0, "0.0"),
    (0, "0"),
    (float("nan"), "nan"),
    (float("inf"), "inf"),
    ("3.35e12", "'3.35e12'"),
    (True, "True"),
    (None, "null"),
], ids=["negative", "zero", "int-zero", "nan", "inf", "string", "bool", "null-required"])
def test_bad_value(value, shown):
    data = _good()
    data["hbm_bandwidth_bytes_per_s"] = value
    with pytest.raises(ConfigError) as err:
        Chip.from_dict(data)
    msg = str(err.value)
    assert "hardware.hbm_bandwidth_bytes_per_s" in msg
    assert shown in msg
    assert "\n" not in msg


@pytest.mark.parametrize("field", list(ENERGY_RANGES))
def test_energy_required(field):
    data = _good()
    data[field] = None
    del data["provenance"][field]
    with pytest.raises(ConfigError, match=rf"hardware\.{field}.*null"):
        Chip.from_dict(data)


def test_bad_value_optional_field():
    data = _good()
    data["fp4_flops_per_s"] = -1.0
    data["provenance"]["fp4_flops_per_s"] = {"kind": "assumed", "source": "test"}
    with pytest.raises(ConfigError, match=r"hardware\.fp4_flops_per_s.*-1\.0"):
        Chip.from_dict(data)


def test_fractional_domain():
    data = _good()
    data["scaleup_domain_chips"] = 8.5
    with pytest.raises(ConfigError, match=r"hardware\.scaleup_domain_chips.*8\.5"):
        Chip.from_dict(data)


def test_unknown_field():
    data = _good()
    data["hbm_bandwith_bytes_per_s"] = 3.35e12  # misspelt
    with pytest.raises(ConfigError, match=r"hardware\.hbm_bandwith_bytes_per_s"):
        Chip.from_dict(data)


def test_missing_provenance():
    data = _good()
    del data["provenance"]["hbm_bandwidth_bytes_per_s"]
    with pytest.raises(ConfigError, match=r"hardware\.provenance\.hbm_bandwidth_bytes_per_s"):
        Chip.from_dict(data)


def test_bad_provenance_kind():
    data = _good()
    data["provenance"]["hbm_bandwidth_bytes_per_s"] = {"kind": "guessed", "source": "test"}
    with pytest.raises(ConfigError, match=r"hardware\.provenance\.hbm_bandwidth_bytes_per_s\.kind.*'guessed'"):
        Chip.from_dict(data)


def test_idle_not_below_rating():
    data = _good()
    data["idle_power_w"] = 700.0
    with pytest.raises(ConfigError, match=r"hardware\.idle_power_w.*700\.0"):
        Chip.from_dict(data)


def test_path_prefix_in_message():
    data = _good()
    data["hbm_capacity_bytes"] = -1.0
    with pytest.raises(ConfigError, match=r"^hardware\[h100_sxm\]\.hbm_capacity_bytes: .*-1\.0"):
        Chip.from_dict(data, path="hardware[h100_sxm]")


def test_from_dict_does_not_mutate_input():
    data = _good()
    before = copy.deepcopy(data)
    Chip.from_dict(data)
    assert data == before


# ---------------------------------------------------------------- batches

def test_stacked_batch_vmaps_math_rate_fallback():
    presets = {p.stem: Chip.from_dict(load_preset(p)) for p in PRESET_PATHS}
    names = [n for n in ("b200", "h100_sxm", "tpu_v5e", "jalapeno_gen1") if n in presets]
    assert len(names) == 4, "the presets this test relies on are missing"
    chips = [presets[n] for n in names]
    batch = stack(chips)
    assert batch.batch_size == len(chips)
    got = np.asarray(jax.vmap(lambda c: c.math_rate("fp4"))(batch))
    # b200 and jalapeno have FP4; h100 falls back to FP8; tpu_v5e (no FP8 either) to BF16.
    expected = [c.fp4_flops_per_s or c.fp8_flops_per_s or c.bf16_flops_per_s for c in chips]
    assert expected == [9.0e15, 1.979e15, 1.97e14, 1.34e16]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the same through jit, and one chip at a time agrees with the batch
    jitted = np.asarray(jax.jit(jax.vmap(lambda c: c.math_rate("fp4")))(batch))
    np.testing.assert_allclose(jitted, expected, rtol=1e-6)
    for chip, want in zip(chips, expected):
        np.testing.assert_allclose(float(chip.math_rate("fp4")), want, rtol=1e-6)  # jnp.where: float32 unless x64
