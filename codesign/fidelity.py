"""Predicting published measurements: one row of a reference file (schema of ../shared/reference/README.md) ->
the serving model's figure for it, differentiable in the serving parameters (for calibration).

A row names a model, a chip, a precision, the chips of one instance, a mapping (``tpN``, ``depN``, ``best``,
``disaggregated``), lengths and their distribution, speculative decoding and a metric. ``codesign.reference``
reads and validates it (one-line errors naming the row) and :meth:`Predictor.predict` evaluates the serving model
over the mappings and concurrencies the benchmark would have searched and reads the metric the way the benchmark
defines it:

- ``max_output_tput_per_chip``: offline (trtllm-bench: all requests queued), best output tokens/s per chip over
  batch sizes that fit, the power-of-two grid and, per mapping, the largest batch whose KV fits (what the
  engine admits);
- ``total_tput_per_chip_at_interactivity``: InferenceX closed loop; per mapping the (interactivity, total tokens/s
  per chip) curve over concurrency, read at the row's interactivity by linear interpolation, best mapping;
- ``prefill_input_tput_per_chip`` / ``decode_output_tput_per_chip``: disaggregated pools, each pool's best mapping;
- ``max_interactivity``: tok/s/user at concurrency 1, best mapping;
- ``peak_total_tput_per_kw``: best total tokens/s per chip over a kW basis the row names (:func:`power_basis`):
  the chip's rating (the schema's definition; the custom-chip disclosure), or InferenceX's all-in provisioned kW
  per GPU (``inferencex_allin_kw``) where the row's unit says all-in or its source is InferenceX (a chip with no
  all-in figure, the custom chip, is read on its rating unless the unit says all-in);
- ``min_e2e_latency_s``: lowest mean end-to-end latency.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from arch_space.errors import ConfigError
from codesign.reference import RowSpec

OFFLINE_CONCURRENCY = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
CLOSED_LOOP_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# a disaggregated decode pool with large EP holds hundreds of sequences per chip over tens of chips (the lmsys
# deployments), so its grid goes on until the KV cache no longer fits (the memory check marks the rest infeasible)
DISAGG_CONCURRENCY = CLOSED_LOOP_CONCURRENCY + (4096, 8192, 16384, 32768, 65536)
DISAGG_DEFAULT_OSL = 1024  # decode length when a disaggregated row gives none (assumed: InferenceX's 1k outputs)
# MTP draft acceptance when a row runs MTP. First draft token: 0.85, the low end of the DeepSeek-V3 report's "85%
# to 90%" for the second-token prediction of its MTP module (arXiv 2412.19437, sec. 5.4.3). Each later draft token,
# given the earlier: 0.7, an assumption (no source in the reference): engines draft N > 1 tokens by chaining that
# one module, which was trained one token ahead and then predicts from its own drafted states, so it accepts less
MTP_FIRST_ACCEPTANCE = 0.85
MTP_LATER_ACCEPTANCE = 0.7


def scenario_for(spec: RowSpec, arch, chip):
    """The serving scenario the row's benchmark ran, and the chips an instance may use."""
    from serving.scenario import Scenario

    domain = int(float(chip.scaleup_domain_chips))
    chips = spec.chips or domain
    if spec.metric == "max_output_tput_per_chip":
        kind, conc = "offline", OFFLINE_CONCURRENCY
    elif spec.mapping == "disaggregated" or spec.metric in ("prefill_input_tput_per_chip",
                                                             "decode_output_tput_per_chip"):
        kind, conc = "disaggregated", DISAGG_CONCURRENCY
    else:
        kind, conc = "closed_loop", CLOSED_LOOP_CONCURRENCY
    draft = spec.draft_tokens if arch.num_mtp_layers else 0
    return Scenario(name="reference-row", kind=kind,  # one name: scenarios differing in numbers share a compile
                    isl_tokens=spec.isl,
                    osl_tokens=spec.osl or DISAGG_DEFAULT_OSL, input_dist=spec.input_dist, concurrency=conc,
                    max_chips=chips, draft_tokens=draft, acceptance_rate=MTP_LATER_ACCEPTANCE if draft else 0.0,
                    first_acceptance_rate=MTP_FIRST_ACCEPTANCE if draft else 0.0)


def mappings_for(spec: RowSpec, arch, max_chips: int):
    from serving.mappings import enumerate_mappings, mapping_name

    all_maps = enumerate_mappings(arch, max_chips)
    if spec.mapping in ("best", "disaggregated"):
        # per-chip figures do not depend on how many instances share the system: any mapping up to its chips
        return all_maps
    named = [m for m in all_maps if mapping_name(m) == spec.mapping]
    if not named:
        raise ConfigError(f"row {spec.row_id}", f"mapping: {spec.mapping!r} is not a mapping of {arch.name} on "
                                                f"{max_chips} chips")
    return named


def _at(a, idx):
    """a[m, idx[m]] for every mapping m of a [M, C] grid array."""
    return jnp.take_along_axis(a, idx[:, None], axis=1)[:, 0]


def read_metric(spec: RowSpec, out: dict, target=None):
    """The row's metric from the grid (arrays [M, C]); returns (value, mapping index, concurrency index).
    ``target``: the interactivity to read at (defaults to the row's; may be traced)."""
    feas = out["infeasible_code"] == 0
    neg = -jnp.inf

    def best(v, sign=1.0):
        masked = jnp.where(feas, sign * v, neg)
        flat = jnp.argmax(masked)
        return sign * jnp.max(masked), flat // v.shape[1], flat % v.shape[1]

    if spec.metric == "max_output_tput_per_chip":
        return best(out["output_tok_s_per_chip"])
    if spec.metric == "prefill_input_tput_per_chip":
        return best(out["prefill_input_tok_s_per_chip"])
    if spec.metric == "decode_output_tput_per_chip":
        return best(out["decode_output_tok_s_per_chip"])
    if spec.metric == "peak_total_tput_per_kw":
        return best(out["total_tok_s_per_allin_kw" if spec.power_basis == "allin" else "total_tok_s_per_kw"])
    if spec.metric == "min_e2e_latency_s":
        return best(out["e2e_s"], -1.0)
    if spec.metric == "max_interactivity":
        return best(out["interactivity_tok_s_user"])
    # total tokens/s per chip at an interactivity: per mapping (rows, all at once: one program whatever the number
    # of mappings), interpolate along concurrency
    x, y = out["interactivity_tok_s_user"], out["total_tok_s_per_chip"]
    target = spec.interactivity if target is None else target
    # interactivity falls as concurrency rises; find each mapping's first concurrency below the target
    below = feas & (x < target)
    j = jnp.argmax(below, axis=1)  # first concurrency slower than the target
    has_below = jnp.any(below, axis=1)
    reach = jnp.max(jnp.where(feas, x, -jnp.inf), axis=1) >= target
    j0 = jnp.maximum(j - 1, 0)
    x0, x1, y0, y1 = _at(x, j0), _at(x, j), _at(y, j0), _at(y, j)
    interp = y0 + jnp.clip((x0 - target) / jnp.maximum(x0 - x1, 1e-12), 0.0, 1.0) * (y1 - y0)
    last_ok = jnp.maximum(jnp.max(jnp.where(feas, jnp.arange(x.shape[1])[None, :], -1), axis=1), 0)
    tail = _at(y, last_ok)  # every feasible point is faster than the target: the slowest one
    inside = has_below & (j > 0)
    vals = jnp.where(reach, jnp.where(inside, interp, jnp.where(has_below, neg, tail)), neg)
    js = jnp.where(inside, j0, last_ok)
    i = jnp.argmax(vals)
    return jnp.max(vals), i, js[i]


def read_interactivity_at(out: dict, value):
    """The frontier read the other way: the best interactivity (tok/s/user) at which any of the row's mappings
    delivers ``value`` total tokens/s per chip, interpolated along concurrency as :func:`read_metric` does; -inf where
    no feasible point delivers it. For an interactivity row this is the error at matched throughput: near a
    deployment's interactivity ceiling the frontier is steep, so a few percent of TPOT there is tens of percent of
    throughput at the row's target, and the two errors together say which is which."""
    feas = out["infeasible_code"] == 0
    x, y = out["interactivity_tok_s_user"], out["total_tok_s_per_chip"]
    # throughput rises with concurrency and interactivity falls: the first point delivering the value is the
    # fastest one that does, and the segment before it crosses the value
    ok = feas & (y >= value)
    j = jnp.argmax(ok, axis=1)
    j0 = jnp.maximum(j - 1, 0)
    x0, x1, y0, y1 = _at(x, j0), _at(x, j), _at(y, j0), _at(y, j)
    crossing = (j > 0) & _at(feas, j0)
    t = jnp.clip((value - y0) / jnp.maximum(y1 - y0, 1e-12), 0.0, 1.0)
    # j = 0: even the lowest concurrency delivers the value, so its interactivity is the most this mapping shows
    x_at = jnp.where(crossing, x0 + t * (x1 - x0), x1)
    return jnp.max(jnp.where(jnp.any(ok, axis=1), x_at, -jnp.inf))


class Predictor:
    """Caches presets, kernel tables and scenarios so predictions (and their gradients) reuse traces."""

    def __init__(self, conf_dir: Path):
        from omegaconf import OmegaConf

        self.conf_dir = Path(conf_dir)
        self._load = lambda rel: OmegaConf.to_container(OmegaConf.load(self.conf_dir / rel), resolve=True)
        self.models = {p.stem for p in (self.conf_dir / "workload").glob("*.yaml")}
        self.hardware = {p.stem for p in (self.conf_dir / "hardware").glob("*.yaml")}
        self._cache: dict = {}

    def _get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def inputs(self, spec: RowSpec):
        from arch_space.chip import Chip, stack
        from serving.architecture import ModelArchitecture
        from serving.kernel_table import build_kernel_table
        from serving.precision import Precision
        from serving.scenario import check_positions
        from serving.serve import stack_mappings

        arch = self._get(("arch", spec.model),
                         lambda: ModelArchitecture.from_dict(self._load(f"workload/{spec.model}.yaml")))
        chip = self.chip(spec)
        precision = self._get(("prec", spec.precision),
                              lambda: Precision.from_dict(self._load(f"precision/{spec.precision}.yaml")))
        sc = scenario_for(spec, arch, chip)
        check_positions(sc, arch, f"row {spec.row_id}")  # before the trace: the row's reason, not a wasted trace
        kt = build_kernel_table(arch, precision)
        maps = mappings_for(spec, arch, sc.max_chips)
        return arch, stack([chip]), kt, sc, maps, stack_mappings(maps)

    def chip(self, spec: RowSpec):
        """The row's hardware preset as a Chip (loaded once per name)."""
        from arch_space.chip import Chip

        return self._get(("chip", spec.hardware),
                         lambda: Chip.from_dict(self._load(f"hardware/{spec.hardware}.yaml"), spec.hardware))

    def vendor(self, spec: RowSpec) -> str:
        """The row's chip vendor (whose family's serving parameters predict it)."""
        return self.chip(spec).vendor

    def predict(self, spec: RowSpec, params):
        """(value, mapping name, concurrency) for the row under serving parameters ``params`` (a ServingParams, or
        a ParamSet: the set of the row's chip's vendor family)."""
        return self.predict_row(spec, params)[:3]

    def predict_row(self, spec: RowSpec, params):
        """:meth:`predict`'s (value, mapping name, concurrency) and, for a ``total_tput_per_chip_at_interactivity``
        row with a measured value, the best interactivity at which the model delivers that throughput
        (:func:`read_interactivity_at`; NaN where it never does, and for every other row), from one evaluation."""
        from serving.mappings import mapping_name
        from serving.perf import ParamSet

        if spec.power_basis == "allin" and not float(self.chip(spec).allin_power_w) > 0:
            if spec.power_basis_stated:
                raise ConfigError(f"row {spec.row_id}", f"unit: per all-in kW (InferenceX's basis), but "
                                                        f"{spec.hardware} has no all-in kW figure (allin_power_w)")
            # an InferenceX source, but a chip without an all-in figure: the custom chip, whose disclosure
            # divides by its own rating (reference README, "How the two benchmark families measure")
            spec = dataclasses.replace(spec, power_basis="rating")
        if isinstance(params, ParamSet):
            params = params.for_vendor(self.vendor(spec))
        static, args, maps, sc = self._row_args(spec)
        x_at = math.nan
        if spec.metric == "max_output_tput_per_chip":
            value, i, c = _predict_row(params, static, *args)  # one program per scenario kind and size bucket
        else:
            # every grid metric in one program (per scenario kind and size bucket): a file mixing the closed-loop
            # metrics compiles once, not once per metric (compiles are most of a diverse file's time)
            values, idx, used, x = _predict_grid_metrics(params, *args, np.float32(spec.value or 0.0))
            k = GRID_READS.index((spec.metric, spec.power_basis))
            value, i, c = values[k], idx[k], used[k]
            if spec.metric == "total_tput_per_chip_at_interactivity" and spec.value is not None \
                    and math.isfinite(float(x)):
                x_at = float(x)
        return value, mapping_name(maps[int(i)]), int(c), x_at

    def why_not(self, spec: RowSpec, params) -> str:
        """Why the row has no prediction: the most common infeasibility over its mappings and concurrencies, or,
        for a row at an interactivity, the best interactivity any feasible point reaches."""
        from serving.memory import INFEASIBLE_REASONS
        from serving.perf import ParamSet
        from serving.serve import evaluate_grid

        if isinstance(params, ParamSet):
            params = params.for_vendor(self.vendor(spec))
        arch, chips, kt, sc, maps, stacked = self.inputs(spec)
        out = evaluate_grid(chips, kt, params, sc, stacked, np.asarray(sc.concurrency, np.float32))
        code = np.asarray(out["infeasible_code"][0])
        if not (code == 0).any():
            counts = {c: int((code == c).sum()) for c in INFEASIBLE_REASONS if (code == c).any()}
            worst = max(counts, key=counts.get)
            return (f"no feasible operating point on {sc.max_chips} {spec.hardware} chips: "
                    f"{INFEASIBLE_REASONS[worst]} ({counts[worst]} of {code.size} points)")
        if spec.metric == "total_tput_per_chip_at_interactivity":
            best = float(np.max(np.where(code == 0, np.asarray(out["interactivity_tok_s_user"][0]), 0.0)))
            return (f"interactivity {spec.interactivity:g} tok/s/user is beyond the best any feasible point "
                    f"reaches ({best:.1f} tok/s/user)")
        return "no feasible operating point reaches this metric"

    def _row_args(self, spec: RowSpec, least_mappings: int = 16):
        """(static metric key, traced arguments, the row's mappings, its scenario): only the metric (and a per-kW
        row's basis) shapes the fit's program, everything else is data, so rows of one scenario kind share one
        compile; predictions of every grid metric share one program per scenario kind (:func:`_grid_metrics_of`)."""
        from serving.kernel_table import pad_kernels
        from serving.serve import stack_mappings

        arch, chips, kt, sc, maps, stacked = self.inputs(spec)
        static = RowSpec(row_id="", model="", hardware="", precision="", chips=None, mapping="", isl=1, osl=None,
                         input_dist="", draft_tokens=0, metric=spec.metric, interactivity=None, value=None,
                         power_basis=spec.power_basis)
        # Kernels and mappings padded to powers of two (neutral rows; padded mappings repeat the first, and every
        # arg-max takes the first of equal values, so a real mapping is always the one reported): rows of every
        # model share the compiles of their scenario kind and metric (a diverse file compiled once per model before).
        # Predictions pad mappings to at least 16: a dense model's 7 mappings on 8 chips then share the compile of
        # an MoE model's 15, and evaluating 9 padded mappings once costs far less than a compile
        kt = pad_kernels(kt, _bucket(kt.num_kernels))
        stacked = stack_mappings(list(maps) + [maps[0]] * (_bucket(len(maps), least_mappings) - len(maps)))
        return static, (chips, kt, sc, stacked, np.asarray(sc.concurrency, np.float32),
                        np.float32(spec.interactivity or 0.0)), maps, sc

    def loss_terms(self, spec: RowSpec):
        """(static metric key, traced arguments) for :func:`row_log_error`."""
        # the fit's own bucket floor (8): its 58 rows x 1200 steps pay for padded mappings on every evaluation
        static, args, _, _ = self._row_args(spec, least_mappings=8)
        return static, args + (np.float32(math.log(spec.value)),)


def _bucket(n: int, least: int = 8) -> int:
    """The power of two >= n (at least ``least``)."""
    return max(least, 1 << (int(n) - 1).bit_length())


def _grid(params, chips, kt, sc, maps, conc):
    """The row's grid (one design: arrays [M, C]) and the concurrency each point ran at."""
    from serving.serve import evaluate_grid

    out = {k: v[0] for k, v in evaluate_grid(chips, kt, params, sc, maps, conc).items()}
    return out, jnp.broadcast_to(conc[None, :], out["infeasible_code"].shape)


def _metric_of(params, static, chips, kt, sc, maps, conc, target):
    """(value, mapping index, concurrency used) of the row's metric over its mappings and concurrencies."""
    out, used = _grid(params, chips, kt, sc, maps, conc)
    if static.metric == "max_output_tput_per_chip":
        # trtllm-bench queues every request and admits as many as its KV cache holds at their full context
        # (GUARANTEED_NO_EVICT): that batch is rarely a power of two, and where the cache is the limit (long
        # outputs) the grid point below it under-counts the batch by up to 2x. Each mapping also runs at the
        # largest batch that fits, capped at the grid's largest.
        from serving.memory import max_sequences
        from serving.serve import evaluate_point

        chip = jax.tree_util.tree_map(lambda x: x[0], chips)
        ctx = jnp.asarray(sc.max_context_tokens, jnp.float32)
        fill = jnp.clip(jnp.floor(jax.vmap(lambda m: max_sequences(chip, kt, params, m, ctx))(maps)),
                        1.0, conc[-1])  # [M]
        at_fill = jax.vmap(lambda m, b: evaluate_point(chip, kt, params, sc, m, b))(maps, fill)
        out = {k: jnp.concatenate([out[k], at_fill[k][:, None]], axis=1) for k in out}
        used = jnp.concatenate([used, fill[:, None]], axis=1)
    value, i, j = read_metric(static, out, target)
    return value, i, used[i, j]


GRID_READS = tuple((m, "rating") for m in ("total_tput_per_chip_at_interactivity", "max_interactivity",
                                            "peak_total_tput_per_kw", "min_e2e_latency_s",
                                            "prefill_input_tput_per_chip", "decode_output_tput_per_chip")
                   ) + (("peak_total_tput_per_kw", "allin"),)


def _grid_metrics_of(params, chips, kt, sc, maps, conc, target, value):
    """Every metric read from the grid alone (all but max_output_tput_per_chip, which adds the KV-fill batch):
    (values, mapping indices, concurrencies used), each in GRID_READS order (metric, kW basis), and the
    interactivity at which the grid delivers ``value`` total tokens/s per chip (:func:`read_interactivity_at`)."""
    from types import SimpleNamespace

    out, used = _grid(params, chips, kt, sc, maps, conc)
    read = [read_metric(SimpleNamespace(metric=m, interactivity=None, power_basis=b), out, target)
            for m, b in GRID_READS]
    return (jnp.stack([v for v, _, _ in read]), jnp.stack([i for _, i, _ in read]),
            jnp.stack([used[i, j] for _, i, j in read]), read_interactivity_at(out, value))


def _row_log_error(params, static, chips, kt, sc, maps, conc, target, log_value):
    value = _metric_of(params, static, chips, kt, sc, maps, conc, target)[0]
    return (jnp.log(value) - log_value) ** 2


import jax  # noqa: E402

from serving.compile import jit  # noqa: E402

# read_metric is dozens of small array operations: run eagerly they cost more than the evaluation itself
_predict_row = jit(_metric_of, static_argnums=(1,))
_predict_grid_metrics = jit(_grid_metrics_of)
row_log_error = jit(jax.value_and_grad(_row_log_error), static_argnums=(1,))
