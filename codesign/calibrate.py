"""``python -m codesign.calibrate``: fit the serving model's named parameters to measured serving results.

One set of parameters per vendor family (``families=true``, the default: a shared set plus penalised family
offsets, :func:`fit_families`) or one shared by every chip (``families=false``), never per row or per chip, is
fitted to
``../shared/reference/measured_calibration.csv`` by gradient-based least squares on the log error,
sum_rows (log predicted - log measured)^2, with the serving model's own JAX gradients (Adam; fractions are fitted
through a logistic, positive quantities through a log, so every iterate is a valid parameter set), plus by default a
weak Gaussian prior toward the starting config (``prior_weight``, MAP: cross-validation chose it, conf/calibrate.yaml;
``prior_weight=0`` is plain least squares, ``conf/serving/calibrated_ls.yaml``). The result,
with the fit's per-row errors, its median and the data it was fitted on, is written atomically to
``conf/serving/calibrated.yaml`` (``output=``), which configs select with ``serving=calibrated``. The fit is
deterministic: same data, same start, same iterations, same file.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import hydra
import jax
import jax.numpy as jnp
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_names, check_quantity
from codesign.cli import CONF_DIR, entry, fail, output_path
from codesign.fidelity import Predictor, row_log_error
from codesign.reference import read_reference
from serving.perf import FRACTIONS, ServingParams
from sweeps.store import atomic_write_text

PROG = "codesign.calibrate"
KEYS = ("serving", "reference", "output", "fit", "iterations", "learning_rate", "families", "family_penalty",
        "prior_weight", "cv", "cv_output")
# leave-one-group-out: unseen models, chips, metrics, or setups (model x chip x precision x metric: RowSpec.setup)
CV_GROUPS = ("model", "hardware", "metric", "setup")
DEFAULT_FIT = ("gemm_efficiency_max", "attention_efficiency_max", "moe_efficiency_max", "fp4_efficiency",
               "memory_efficiency_max", "gemm_rows_half", "gemm_k_half", "moe_rows_half", "kernel_overhead_s",
               "collective_overhead_s", "step_overhead_s", "link_efficiency", "comm_overlap")


def to_z(params: ServingParams, fields) -> jnp.ndarray:
    vals = []
    for f in fields:
        v = float(getattr(params, f))
        vals.append(math.log(v / (1 - v)) if f in FRACTIONS else math.log(max(v, 1e-12)))
    return jnp.asarray(vals, jnp.float32)


def from_z(z, base: ServingParams, fields) -> ServingParams:
    vals = {f: (jax.nn.sigmoid(z[i]) if f in FRACTIONS else jnp.exp(z[i])) for i, f in enumerate(fields)}
    return dataclasses.replace(base, **vals)


def adam(loss_and_grad, x, iterations: int, lr: float, log=print, label: str = "mean squared log error"):
    """Adam (Kingma & Ba 2015) minimising ``loss_and_grad(x) -> (loss, grad)`` from ``x``; returns (the best x
    seen, the history of losses with the best appended). A step that leaves the region where every row is
    predictable (a non-finite loss or gradient, e.g. a row's interactivity became unreachable) is undone and the
    step size halved: deterministic backtracking."""
    m, v = jnp.zeros_like(x), jnp.zeros_like(x)
    b1, b2, eps = 0.9, 0.999, 1e-8
    history, prev, best = [], None, (float("inf"), x)
    for it in range(iterations):
        loss, g = loss_and_grad(x)
        if not (math.isfinite(loss) and bool(jnp.all(jnp.isfinite(g)))):
            if prev is None:
                raise ConfigError("serving", "the starting parameters leave some rows unpredictable; "
                                             "validate them first (python -m codesign.validate)")
            x, m, v = prev
            lr *= 0.5
            history.append(float("nan"))
            log(f"  iteration {it:4d}  step rejected (a row became unpredictable); learning rate {lr:.3g}")
            continue
        if loss < best[0]:
            best = (loss, x)
        prev = (x, m, v)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1 ** (it + 1))) / (jnp.sqrt(v / (1 - b2 ** (it + 1))) + eps)
        history.append(loss)
        if it % 10 == 0 or it == iterations - 1:
            log(f"  iteration {it:4d}  {label} {loss:.4f}")
    history.append(best[0])
    return best[1], history


def _sum_rows(params: ServingParams, terms) -> tuple[float, object]:
    """Sum of the rows' squared log errors and of their gradients in the serving parameters (None: no rows)."""
    total, grad_p = 0.0, None
    for static, args in terms:
        val, g = row_log_error(params, static, *args)
        total += float(val)
        grad_p = g if grad_p is None else jax.tree_util.tree_map(jnp.add, grad_p, g)
    return total, grad_p


def fit(predictor: Predictor, specs, base: ServingParams, fields, iterations: int, lr: float, log=print,
        prior: float = 0.0):
    """Adam on z (the transformed parameters); returns (params, history of losses). ``prior`` > 0 adds
    prior x |z - z_start|^2 (MAP with a Gaussian prior at the starting config, in transformed units: a factor e
    on a positive quantity, one logit on a fraction), so a parameter the rows do not pin down stays near its
    physical start instead of drifting to wherever it helps the rows it has."""
    terms = [predictor.loss_terms(s) for s in specs]
    z0 = to_z(base, fields)

    def loss_and_grad(z):
        total, grad_p = _sum_rows(from_z(z, base, fields), terms)
        (gz,) = jax.vjp(lambda zz: from_z(zz, base, fields), z)[1](grad_p)
        dz = z - z0
        return total / len(terms) + prior * float(jnp.sum(dz * dz)), gz / len(terms) + 2.0 * prior * dz

    z, history = adam(loss_and_grad, z0, iterations, lr, log, label="objective" if prior else
                      "mean squared log error")
    return from_z(z, base, fields), history


def fit_families(predictor: Predictor, specs, base: ServingParams, fields, iterations: int, lr: float,
                 penalty: float, log=print, prior: float = 0.0):
    """One set per vendor family, fitted jointly as a shared set plus a family offset (hierarchical least squares):
    row r of family f is predicted with from_z(z + d_f) and the loss is

        mean_r (log predicted_r - log measured_r)^2 + penalty x sum_f |d_f|^2 + prior x |z - z_start|^2

    so a family with few rows stays near the shared set, and the shared set (used for chips of families without
    rows: candidate designs, vendors never measured) is the compromise the penalty draws. Adam on (z, d) with the
    same deterministic backtracking (:func:`adam`). Returns (ParamSet, history)."""
    from serving.perf import ParamSet, family_of

    terms = [predictor.loss_terms(s) for s in specs]
    fams = sorted({family_of(predictor.vendor(s)) for s in specs})
    row_f = [fams.index(family_of(predictor.vendor(s))) for s in specs]
    p = len(fields)
    x0 = jnp.concatenate([to_z(base, fields), jnp.zeros(len(fams) * p, jnp.float32)])

    def split(x):
        return x[:p], x[p:].reshape(len(fams), p)

    def loss_and_grad(x):
        z, d = split(x)
        total, gz, gd = 0.0, jnp.zeros(p), jnp.zeros((len(fams), p))
        for f in range(len(fams)):
            zf = z + d[f]
            part, grad_p = _sum_rows(from_z(zf, base, fields), [t for t, rf in zip(terms, row_f) if rf == f])
            total += part
            if grad_p is not None:
                (g_f,) = jax.vjp(lambda zz: from_z(zz, base, fields), zf)[1](grad_p)
                gz, gd = gz + g_f, gd.at[f].add(g_f)
        n = len(terms)
        dz = z - x0[:p]
        loss = total / n + penalty * float(jnp.sum(d * d)) + prior * float(jnp.sum(dz * dz))
        return loss, jnp.concatenate([gz / n + 2.0 * prior * dz, (gd / n + 2.0 * penalty * d).reshape(-1)])

    x, history = adam(loss_and_grad, x0, iterations, lr, log, label="objective")
    z, d = split(x)
    shared = from_z(z, base, fields)
    return ParamSet(shared, tuple((f, from_z(z + d[i], base, fields)) for i, f in enumerate(fams))), history


def cross_validate(predictor: Predictor, rows, specs, by: str, fit_rows, log=print) -> list[dict]:
    """Leave-one-group-out cross-validation: for every value g of ``by`` (a model, a chip, a metric or a setup:
    RowSpec.setup), fit with ``fit_rows(specs) -> params`` on the rows whose ``by`` is not g and predict the rows
    whose ``by`` is g with those parameters. Returns validate's records with a ``fold`` column: every row predicted
    by a fit that never saw its group (its model, its chip, its metric or its setup), the honest estimate of how the
    calibration carries to measurements it was not fitted on. A held-out chip whose vendor family has no other rows
    is predicted with the shared set, exactly as an unmeasured chip or a candidate design is."""
    from codesign.validate import validate_rows

    out: list = [None] * len(specs)
    for g in sorted({getattr(s, by) for s in specs}):
        train = [s for s in specs if getattr(s, by) != g]
        held = [i for i, s in enumerate(specs) if getattr(s, by) == g]
        log(f"{PROG}: fold {by}={g}: fitting on {len(train)} rows, predicting {len(held)}")
        params = fit_rows(train)
        for i, rec in zip(held, validate_rows(predictor, params, [rows[i] for i in held], [specs[i] for i in held])):
            out[i] = rec | {"fold": f"{by}={g}"}
    return out


def cv_summary(records: list[dict]) -> str:
    """Out-of-fold |error| per fold and overall."""
    from codesign.validate import error_stats

    folds = sorted({r["fold"] for r in records})
    lines = [f"  held out {f:<44s} {error_stats([r for r in records if r['fold'] == f])}" for f in folds]
    lines.append(f"  all rows{' ' * 46}{error_stats(records)}")
    if any(r["interactivity_error_pct"] for r in records):  # rows at an interactivity, read at matched throughput
        lines.append(f"  interactivity at the measured throughput{' ' * 14}"
                     f"{error_stats(records, 'interactivity_error_pct')}")
    return "\n".join(["out-of-fold errors (each row predicted by a fit that never saw its group):", *lines])


def _validate(cfg: dict, overridden=()):
    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    base = ServingParams.from_dict(cfg["serving"], "serving")
    names = {f.name for f in dataclasses.fields(ServingParams)}
    fields = DEFAULT_FIT if cfg["fit"] is None else check_names(cfg["fit"], "fit", what="serving parameter name")
    for i, f in enumerate(fields):
        if f not in names:
            raise ConfigError(f"fit[{i}]", f"unknown serving parameter {f!r} (known: {', '.join(sorted(names))})")
    iterations = check_quantity(cfg["iterations"], "iterations", integer=True)
    lr = check_quantity(cfg["learning_rate"], "learning_rate")
    if not isinstance(cfg["families"], bool):
        raise ConfigError("families", f"expected true (one set per vendor family) or false (one set), "
                                      f"got {cfg['families']!r}")
    penalty = check_quantity(cfg["family_penalty"], "family_penalty", allow_zero=True)
    prior = check_quantity(cfg["prior_weight"], "prior_weight", allow_zero=True)
    from codesign.validate import reference_file

    ref = reference_file(cfg["reference"])
    predictor = Predictor(CONF_DIR)
    rows, specs = read_reference(ref, predictor.models, predictor.hardware)
    missing = [s.row_id for s in specs if s.value is None]
    if missing:
        raise ConfigError(str(ref), f"rows without a measured value cannot be fitted: {', '.join(missing[:5])}")
    # null: the default calibration file; an empty string is refused (it once meant that file too, silently)
    out = CONF_DIR / "serving" / "calibrated.yaml" if cfg["output"] is None else output_path(cfg["output"], "output")
    cv = cfg["cv"]
    if cv is not None:
        if cv not in CV_GROUPS:
            raise ConfigError("cv", f"expected null or one of {', '.join(CV_GROUPS)}, got {cv!r}")
        if len({getattr(s, cv) for s in specs}) < 2:
            raise ConfigError("cv", f"the reference file has one {cv} only: nothing to hold out")
        output_path(cfg["cv_output"], "cv_output")
    return base, fields, iterations, lr, ref, predictor, rows, specs, out, cfg["families"], penalty, prior


def calibration_yaml(params, fields, ref: Path, specs, records, history, penalty: float | None = None,
                     prior: float = 0.0) -> str:
    """The calibration file. ``params``: a ServingParams (one set for all chips) or a ParamSet (shared + per
    family)."""
    from serving.perf import ParamSet

    pset = params if isinstance(params, ParamSet) else ParamSet(params)
    errs = [abs(float(r["error_pct"])) for r in records if r["error_pct"]]
    how = (["one parameter set per vendor family (a shared set plus penalised family offsets;",
            "# chips of other families and candidate designs use the shared set),"] if pset.families
           else ["one parameter set shared by all chips,"])
    lines = ["# Serving-model parameters fitted by `python -m codesign.calibrate` (do not edit by hand: refit).",
             f"# Fitted on {len(specs)} rows of {ref.name}: {how[0]}", *how[1:],
             "# gradient-based least squares on log error (codesign/calibrate.py). Per-row errors are in `fit` below.",
             *([f"# MAP: plus prior_weight={prior:g} x |z - z_start|^2 toward the starting config (conf/serving/"
                f"default.yaml), in the fitted transform"] if prior
               else ["# Plain least squares: prior_weight=0, no prior toward the starting config"]),
             ""]
    for f in dataclasses.fields(ServingParams):
        v = float(getattr(pset.shared, f.name))
        tag = "  # fitted" if f.name in fields else "  # kept from the starting config"
        lines.append(f"{f.name}: {v:.6g}{tag}")
    if pset.families:
        lines += ["unmeasured_family: null  # chips of vendors without a fitted set (candidate designs, Gen 1, TPUs...)"
                  " use the shared set;",
                  "                         # a family name (e.g. nvidia) gives them that family's software maturity"]
        lines.append("families:  # fitted per vendor family (the chip's vendor, lower case)")
        for name, fp in pset.families:
            lines.append(f"  {name}:")
            lines += [f"    {f}: {float(getattr(fp, f)):.6g}" for f in fields]
    lines += ["fit:", f"  data: {ref.name}", f"  rows: {len(specs)}", f"  iterations: {len(history)}",
              (f"  final_objective: {history[-1]:.6g}  # mean squared log error"
               + (" + family penalty" if pset.families else "") + (" + prior" if prior else "")
               if pset.families or prior
               else f"  final_mean_squared_log_error: {history[-1]:.6g}"),
              f"  median_abs_error_pct: {float(np.median(errs)):.2f}" if errs else "  median_abs_error_pct: null",
              f"  p90_abs_error_pct: {float(np.percentile(errs, 90)):.2f}" if errs else "  p90_abs_error_pct: null",
              "  fitted: [" + ", ".join(fields) + "]"]
    if pset.families:
        lines.append(f"  family_penalty: {penalty:g}")
    lines.append(f"  prior_weight: {prior:g}  # x |z - z_start|^2 toward the starting config"
                 + ("" if prior else " (0: plain least squares)"))
    lines.append("  per_row_error_pct:")
    for r in records:
        lines.append(f"    {r['id']}: {r['error_pct'] or 'null'}")
    return "\n".join(lines) + "\n"


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="calibrate")
def _main(cfg: DictConfig) -> None:
    from codesign.validate import summary, validate_rows

    try:
        base, fields, iterations, lr, ref, predictor, rows, specs, out, families, penalty, prior = _validate(
            OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as err:
        fail(PROG, err)
    t0 = time.perf_counter()
    per = "per vendor family" if families else "shared by all chips"

    def fit_rows(rows_specs, log=print):
        if families:
            return fit_families(predictor, rows_specs, base, fields, iterations, lr, penalty, log=log, prior=prior)
        return fit(predictor, rows_specs, base, fields, iterations, lr, log=log, prior=prior)

    if cfg.cv:
        from codesign.validate import OUT_COLUMNS, write_csv

        print(f"{PROG}: leave-one-{cfg.cv}-out cross-validation of {len(fields)} parameters ({per}) on {len(specs)} "
              f"rows of {ref} (the calibration file is not touched)")
        records = cross_validate(predictor, rows, specs, cfg.cv, lambda sp: fit_rows(sp, log=lambda *_: None)[0])
        write_csv(Path(cfg.cv_output), records, (*OUT_COLUMNS, "fold"))
        print(cv_summary(records))
        print(f"{PROG}: wrote {cfg.cv_output} in {time.perf_counter() - t0:.0f} s")
        return
    print(f"{PROG}: fitting {len(fields)} parameters ({per}) to {len(specs)} rows of {ref}")
    params, history = fit_rows(specs)
    records = validate_rows(predictor, params, rows, specs)
    atomic_write_text(out, calibration_yaml(params, fields, ref, specs, records, history, penalty, prior))
    print(summary(records, 5))
    print(f"{PROG}: wrote {out} in {time.perf_counter() - t0:.0f} s")


def cli() -> None:
    entry(PROG, "calibrate", _validate, _main)


if __name__ == "__main__":
    cli()
