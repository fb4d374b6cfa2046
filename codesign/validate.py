"""``python -m codesign.validate reference=IN.csv output=OUT.csv``: predict every row of a reference file.

For each row (schema of ``../shared/reference/README.md``) the serving model predicts the row's metric for its
model, chip, precision, chips, mapping (searched when ``best``), lengths, length distribution and speculative
setting (``codesign/fidelity.py``). OUT.csv has every input column plus ``predicted``, ``error_pct``
((predicted - value) / value x 100), ``mapping_used``, ``concurrency_used``, for a row at an interactivity
``interactivity_at_value`` and ``interactivity_error_pct`` (the interactivity at which the model delivers the
measured throughput, and its error against the row's: the error at matched throughput, which stays small near a
ceiling where the throughput error does not), and ``reason`` where a row cannot be predicted (``predicted`` is then
empty). The summary gives the rows predicted, the median and 90th-percentile absolute error and the worst rows. A
malformed file fails with one line naming the row and the field.
"""

from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_quantity
from codesign.cli import CONF_DIR, entry, fail, output_path
from codesign.fidelity import Predictor
from codesign.reference import COLUMNS, read_reference
from serving.perf import ParamSet
from sweeps.store import atomic_write_text

PROG = "codesign.validate"
KEYS = ("serving", "reference", "output", "worst")
DEFAULT_REFERENCE = CONF_DIR.parent.parent / "shared" / "reference" / "measured_calibration.csv"
# interactivity_at_value / interactivity_error_pct: for a row at an interactivity, the interactivity at which the
# model delivers the measured throughput and its error against the row's (the error at matched throughput)
OUT_COLUMNS = COLUMNS + ("predicted", "error_pct", "mapping_used", "concurrency_used", "interactivity_at_value",
                         "interactivity_error_pct", "reason")
AT_INTERACTIVITY = "total_tput_per_chip_at_interactivity"


def _validate(cfg: dict, overridden=()):
    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    params = ParamSet.from_dict(cfg["serving"], "serving")  # per vendor family where the file has families
    ref = reference_file(cfg["reference"])
    out = output_path(cfg["output"], "output")
    check_quantity(cfg["worst"], "worst", integer=True)
    predictor = Predictor(CONF_DIR)
    rows, specs = read_reference(ref, predictor.models, predictor.hardware)  # validates every row up front
    return params, ref, out, int(cfg["worst"]), predictor, rows, specs


def reference_file(value) -> Path:
    """The ``reference=`` file: a path, or null for the shared calibration file."""
    if value is None:
        return DEFAULT_REFERENCE
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("reference", f"expected a path to a reference CSV, or null, got {value!r}")
    return Path(value).expanduser()


def validate_rows(predictor: Predictor, params, rows, specs) -> list[dict]:
    out = []
    for row, spec in zip(rows, specs):
        rec = {c: row.get(c, "") for c in COLUMNS} | {k: "" for k in OUT_COLUMNS[len(COLUMNS):]}
        try:
            value, mapping, conc, x_at = predictor.predict_row(spec, params)
            value = float(value)
        except ConfigError as err:
            rec["reason"] = err.detail
            out.append(rec)
            continue
        if not math.isfinite(value) or value <= 0:
            rec["reason"] = predictor.why_not(spec, params)
        else:
            rec["predicted"] = f"{value:.6g}"
            rec["mapping_used"], rec["concurrency_used"] = mapping, str(conc)
            if spec.value is not None:
                rec["error_pct"] = f"{(value - spec.value) / spec.value * 100:.2f}"
        if math.isfinite(x_at):  # also when the target is out of the model's reach: how far short it falls
            rec["interactivity_at_value"] = f"{x_at:.6g}"
            rec["interactivity_error_pct"] = f"{(x_at - spec.interactivity) / spec.interactivity * 100:.2f}"
        out.append(rec)
    return out


def error_stats(records: list[dict], column: str = "error_pct") -> str:
    """Median and 90th-percentile |error| of the records that have one (``column``: which error)."""
    e = np.asarray([abs(float(r[column])) for r in records if r[column]])
    if not len(e):
        return "no row with a measured value predicted"
    return f"median |error| {np.median(e):5.1f}%  p90 {np.percentile(e, 90):6.1f}%  ({len(e)} rows)"


def summary(records: list[dict], worst: int) -> str:
    errs = [(abs(float(r["error_pct"])), r) for r in records if r["error_pct"]]
    lines = [f"rows: {len(records)}, predicted: {sum(1 for r in records if r['predicted'])}, "
             f"not predicted: {sum(1 for r in records if r['reason'])}"]
    if errs:
        a = np.asarray([e for e, _ in errs])
        lines.append(f"median |error|: {np.median(a):.1f}%   p90 |error|: {np.percentile(a, 90):.1f}%")
        for col in ("model", "hardware", "metric"):  # where the errors sit
            groups = sorted({r[col] for _, r in errs})
            if len(groups) > 1:
                lines += [f"  {col + ' ' + g:<47s} {error_stats([r for _, r in errs if r[col] == g])}"
                          for g in groups]
        at = [r for r in records if r["metric"] == AT_INTERACTIVITY]
        if any(r["interactivity_error_pct"] for r in at):
            lines.append(f"  {'interactivity at the measured throughput':<47s} "
                         f"{error_stats(at, 'interactivity_error_pct')}")
        for e, r in sorted(errs, key=lambda t: -t[0])[:worst]:
            lines.append(f"  worst {r['id']}: {r['model']} on {r['hardware']} {r['metric']} value {r['value']} "
                         f"predicted {r['predicted']} ({float(r['error_pct']):+.1f}%, {r['mapping_used']} "
                         f"@ {r['concurrency_used']})")
    for r in records:
        if r["reason"]:
            lines.append(f"  not predicted {r['id']}: {r['reason']}")
    return "\n".join(lines)


def write_csv(path: Path, records: list[dict], columns=OUT_COLUMNS) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    w.writerows(records)
    atomic_write_text(path, buf.getvalue())


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="validate")
def _main(cfg: DictConfig) -> None:
    try:
        params, ref, out, worst, predictor, rows, specs = _validate(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as err:
        fail(PROG, err)
    t0 = time.perf_counter()
    records = validate_rows(predictor, params, rows, specs)
    write_csv(out, records)
    print(summary(records, worst))
    print(f"wrote {out} ({len(records)} rows in {time.perf_counter() - t0:.1f} s)")


def cli() -> None:
    entry(PROG, "validate", _validate, _main)


if __name__ == "__main__":
    cli()
