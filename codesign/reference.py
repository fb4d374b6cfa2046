"""The reference-file schema (``../shared/reference/README.md``): one measured (or to-be-predicted) serving
result per row. :func:`read_reference` reads a file and validates every row up front (:func:`row_spec`: one-line
errors naming the row and the field); :mod:`codesign.fidelity` predicts the rows."""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from pathlib import Path

from arch_space.errors import ConfigError

COLUMNS = ("id", "model", "hardware", "precision", "chips", "mapping", "isl", "osl", "input_dist", "speculative",
           "metric", "interactivity", "value", "unit", "confidence", "source")
METRICS = ("max_output_tput_per_chip", "total_tput_per_chip_at_interactivity", "prefill_input_tput_per_chip",
           "decode_output_tput_per_chip", "max_interactivity", "peak_total_tput_per_kw", "min_e2e_latency_s")
PRECISIONS = ("bf16", "fp8", "fp4", "int4")


@dataclasses.dataclass(frozen=True)
class RowSpec:
    row_id: str
    model: str
    hardware: str
    precision: str
    chips: int | None
    mapping: str
    isl: int
    osl: int | None
    input_dist: str
    draft_tokens: int
    metric: str
    interactivity: float | None
    value: float | None
    power_basis: str = "rating"  # peak_total_tput_per_kw: "rating" (chip TDP) or "allin" (InferenceX all-in kW)
    power_basis_stated: bool = False  # the row's unit names the basis (else its source implies it)

    @property
    def setup(self) -> str:
        """The measured configuration the row belongs to: its model, chip, precision and metric. Rows of one setup
        differ only in lengths, chips, mapping or interactivity target (one benchmark sweep of one deployment), so
        leaving a setup out (``calibrate cv=setup``) predicts a deployment the fit never saw while every other one,
        of the same kinds, stays in: a published result of a configuration not in the file."""
        return f"{self.model}/{self.hardware}/{self.precision}/{self.metric}"


def _int(row, key, where, *, required=True):
    raw = (row.get(key) or "").strip()
    if not raw:
        if required:
            raise ConfigError(where, f"{key}: missing")
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(where, f"{key}: expected a number, got {raw!r}") from None
    if not math.isfinite(v) or v <= 0 or v != int(v):
        raise ConfigError(where, f"{key}: must be a positive whole number, got {raw!r}")
    return int(v)


def _positive(row, key, where, what: str) -> float:
    raw = (row.get(key) or "").strip()
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(where, f"{key}: {what}, got {raw!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(where, f"{key}: must be > 0, got {raw!r}")
    return v


def power_basis(row: dict) -> str:
    """The kW a ``peak_total_tput_per_kw`` row divides by. The schema defines the chip's power rating, but
    InferenceX's per-power figures divide by an all-in provisioned kW per GPU (reference README: host, network and
    PUE; 2.17 kW for a 1 kW B200), a factor of ~2 apart. The row's unit decides where it names a basis (all-in /
    provisioned, or rating / TDP); otherwise an InferenceX (SemiAnalysis, PowerX) source means all-in, anything
    else the rating. A chip without an all-in figure (the custom chip, whose disclosure divides by its own rating)
    is read on its rating unless the unit states all-in (``Predictor.predict_row``)."""
    stated = stated_power_basis(row)
    if stated:
        return stated
    return "allin" if re.search(r"inferencex|inferencemax|semianalysis|powerx", (row.get("source") or "").lower()) \
        else "rating"


def stated_power_basis(row: dict) -> str | None:
    """The kW basis the row's unit names ("allin": all-in / provisioned; "rating": rating / TDP), or None."""
    unit = (row.get("unit") or "").lower()
    if re.search(r"all[- ]?in|provisioned", unit):
        return "allin"
    if re.search(r"\btdp\b|rating|rated", unit):
        return "rating"
    return None


def row_spec(row: dict, line: int, known_models, known_hardware) -> RowSpec:
    where = f"row {line} ({row.get('id') or 'no id'})"
    model, hw = (row.get("model") or "").strip(), (row.get("hardware") or "").strip()
    if model not in known_models:
        raise ConfigError(where, f"model: unknown {model!r} (known: {', '.join(sorted(known_models))})")
    if hw not in known_hardware:
        raise ConfigError(where, f"hardware: unknown {hw!r} (known: {', '.join(sorted(known_hardware))})")
    precision = (row.get("precision") or "").strip()
    if precision not in PRECISIONS:
        raise ConfigError(where, f"precision: must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    mapping = (row.get("mapping") or "").strip()
    if not (mapping in ("best", "disaggregated") or re.fullmatch(r"(tp\d+)?(ep\d+)?(dep\d+)?(pp\d+)?", mapping)
            and mapping):
        raise ConfigError(where, f"mapping: expected tpN, depN, best or disaggregated, got {mapping!r}")
    metric = (row.get("metric") or "").strip()
    if metric not in METRICS:
        raise ConfigError(where, f"metric: must be one of {', '.join(METRICS)}, got {metric!r}")
    dist = (row.get("input_dist") or "fixed").strip()
    if dist not in ("fixed", "uniform_0.8_1.0"):
        raise ConfigError(where, f"input_dist: must be fixed or uniform_0.8_1.0, got {dist!r}")
    spec = (row.get("speculative") or "none").strip()
    m = re.fullmatch(r"mtp(\d+)", spec)
    if spec != "none" and not m:
        raise ConfigError(where, f"speculative: expected none or mtpN, got {spec!r}")
    inter = None
    if metric == "total_tput_per_chip_at_interactivity":
        inter = _positive(row, "interactivity", where, f"a number is required for {metric}")
    value = _positive(row, "value", where, "expected a number") if (row.get("value") or "").strip() else None
    osl_required = mapping != "disaggregated"
    return RowSpec(row_id=(row.get("id") or f"row{line}").strip(), model=model, hardware=hw, precision=precision,
                   chips=_int(row, "chips", where, required=False), mapping=mapping,
                   isl=_int(row, "isl", where), osl=_int(row, "osl", where, required=osl_required), input_dist=dist,
                   draft_tokens=int(m.group(1)) if m else 0, metric=metric, interactivity=inter, value=value,
                   power_basis=power_basis(row) if metric == "peak_total_tput_per_kw" else "rating",
                   power_basis_stated=metric == "peak_total_tput_per_kw" and stated_power_basis(row) is not None)


def read_reference(path: Path, known_models, known_hardware) -> tuple[list[dict], list[RowSpec]]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(str(path), f"cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), f"not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                                     f"a reference file is a UTF-8 CSV") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(str(path), f"missing column(s): {', '.join(missing)} (schema: {', '.join(COLUMNS)})")
    rows = list(reader)
    if not rows:
        raise ConfigError(str(path), "has a header but no rows")
    seen: dict = {}
    for i, r in enumerate(rows):
        if r["id"] in seen:
            raise ConfigError(f"{path} row {i + 2}", f"id {r['id']!r} repeats row {seen[r['id']]} (ids name rows in "
                                                    f"the output and the calibration file: they must be unique)")
        seen[r["id"]] = i + 2
    specs = [row_spec(r, i + 2, known_models, known_hardware) for i, r in enumerate(rows)]
    return rows, specs
