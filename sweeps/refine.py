"""Gradient refinement: follow the serving model's gradients from the best sampled designs of a generation.

A sampled sweep (grid, Sobol', Latin hypercube) finds the region where good designs are; between its points the
serving model is differentiable in every continuous design axis, because the technology model
(``arch_space.design_space.chip_columns``) and the serving model (``serving.serve.evaluate_point``) are both plain
``jax.numpy``. From each of the best designs, at the operating point (mapping, concurrency) where it did best at the
target interactivity on each workload of the mix, this module climbs the mix-weighted sum over workloads of

    J_w(u) = log objective_w(chip(u)) - penalty x max(0, log target - log interactivity_w(chip(u)))^2

over the continuous axes (SRAM share, clock, HBM speed bin, power rating, scale-up bandwidth), each rescaled to
u in [0, 1] over its range (the space's range clipped to the generation's limits), with Adam (Kingma & Ba 2015)
and projection onto the box. Integer axes (dies, stacks, domain) stay where the sample put them. The refined
points are new designs: the caller evaluates them with the full sweep (every mapping and concurrency), so a
refined design is only reported if the complete evaluation confirms it; the climb itself is a proposal.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from arch_space.chip import NUMERIC_FIELDS, Chip
from arch_space.design_space import AXES, DesignSpace, chip_columns
from arch_space.technology import Generation
from serving.compile import jit
from serving.serve import evaluate_point

REFINE_AXES = ("sram_area_fraction", "clock_scale", "hbm_speed_scale", "power_rating_w",
               "scaleup_bandwidth_bytes_per_s")
PENALTY = 10.0  # weight of the squared log shortfall below the target interactivity (a soft constraint)


def refine_bounds(gen: Generation, space: DesignSpace) -> dict[str, tuple[float, float]]:
    """The range each continuous axis may move in: the space's [low, high] within what the generation allows."""
    b = dict(space.bounds())
    limits = {"clock_scale": gen.max_clock_scale,
              "hbm_speed_scale": gen.hbm_stack_bandwidth_max_bytes_per_s / gen.hbm_stack_bandwidth_bytes_per_s,
              "power_rating_w": gen.max_package_power_w, "sram_area_fraction": 0.95}
    out = {}
    for a in REFINE_AXES:
        lo, hi = b[a]
        hi = min(hi, limits.get(a, hi))
        out[a] = (min(lo, hi), hi)
    return out


def _objective(u, fixed, lo, hi, gen, kts, params, scenario, mappings, concurrency, weights, target, objective):
    """Weighted sum over the workloads of the mix of each one's J at its own operating point."""
    p = dict(fixed)
    for i, a in enumerate(REFINE_AXES):
        p[a] = lo[i] + u[i] * (hi[i] - lo[i])
    cols = chip_columns(gen, p, jnp)
    chip = Chip(**{f: cols[f] for f in NUMERIC_FIELDS}, name=gen.name, vendor="candidate", provenance=())
    total = 0.0
    for w, kt in enumerate(kts):
        out = evaluate_point(chip, kt, params, scenario, mappings[w], concurrency[w])
        short = jnp.maximum(0.0, jnp.log(target) - jnp.log(out["interactivity_tok_s_user"]))
        j = jnp.log(out[objective]) - PENALTY * short**2
        total = total + jnp.where(weights[w] > 0, weights[w] * j, 0.0)  # weight 0: no operating point there
    return total


def _climb(u0, fixed, lo, hi, kts, params, scenario, mappings, concurrency, weights, target, lr, *, gen, objective,
           steps):
    def one(u_init, fix, m, c, wt):
        f = lambda u: _objective(u, fix, lo, hi, gen, kts, params, scenario, m, c, wt, target,  # noqa: E731
                                 objective)
        vg = jax.value_and_grad(f)

        def step(state, t):
            u, mom, vel, best_u, best_j = state
            j, g = vg(u)
            g = jnp.where(jnp.isfinite(g), g, 0.0)
            better = jnp.isfinite(j) & (j > best_j)
            best_u, best_j = jnp.where(better, u, best_u), jnp.where(better, j, best_j)
            mom = 0.9 * mom + 0.1 * g
            vel = 0.999 * vel + 0.001 * g * g
            mhat, vhat = mom / (1 - 0.9 ** (t + 1)), vel / (1 - 0.999 ** (t + 1))
            u = jnp.clip(u + lr * mhat / (jnp.sqrt(vhat) + 1e-8), 0.0, 1.0)  # ascent, projected on the box
            return (u, mom, vel, best_u, best_j), j

        z = jnp.zeros_like(u_init)
        init = (u_init, z, z, u_init, jnp.asarray(-jnp.inf, u_init.dtype))
        (u, _, _, best_u, best_j), _ = jax.lax.scan(step, init, jnp.arange(steps, dtype=u_init.dtype))
        j_last = f(u)
        take_last = jnp.isfinite(j_last) & (j_last > best_j)
        return jnp.where(take_last, u, best_u), jnp.where(take_last, j_last, best_j), f(u_init)

    return jax.vmap(one)(u0, fixed, mappings, concurrency, weights)


def refine_designs(gen: Generation, space: DesignSpace, start: dict[str, np.ndarray], mappings,
                   concurrency, kt, params, scenario, target_tok_s_user: float,
                   objective: str = "total_tok_s_per_kw", steps: int | None = None,
                   step_size: float | None = None, weights=None) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Refined axis values for K starting designs (``start``: axis -> [K]). One workload: ``kt`` its kernel table,
    ``mappings`` a Mapping with [K] leaves and ``concurrency`` [K]. A mix of W workloads: ``kt`` a list of W tables,
    ``mappings`` a list of W such Mappings, ``concurrency`` [W, K] and ``weights`` [W, K] (the mix weight, 0 where a
    design has no operating point at the target on that workload). Returns (params, J at the start, J at the
    refined point); values rounded to 6 significant digits so that a design id does not depend on the last bits of
    a floating-point climb."""
    if not isinstance(kt, (list, tuple)):
        kt, mappings, concurrency = [kt], [mappings], np.asarray(concurrency)[None]
    k = len(np.asarray(start["compute_dies"]))
    weights = np.ones((len(kt), k)) if weights is None else np.asarray(weights, np.float64)
    bounds = refine_bounds(gen, space)
    lo = jnp.asarray([bounds[a][0] for a in REFINE_AXES], jnp.float32)
    hi = jnp.asarray([bounds[a][1] for a in REFINE_AXES], jnp.float32)
    span = np.maximum(np.asarray(hi) - np.asarray(lo), 1e-30)
    x0 = np.stack([np.asarray(start[a], np.float64) for a in REFINE_AXES], 1)
    u0 = jnp.asarray(np.clip((x0 - np.asarray(lo)) / span, 0.0, 1.0), jnp.float32)
    fixed = {a: jnp.asarray(start[a], jnp.float32) for a in AXES if a not in REFINE_AXES}
    # the generation's figures are constants of the climb (closed over: a Generation is not a pytree)
    climb = jit(functools.partial(_climb, gen=gen, objective=objective, steps=int(steps or space.refine_steps)))
    u, j_end, j_start = climb(u0, fixed, lo, hi, tuple(kt), params, scenario, tuple(mappings),
                              jnp.asarray(np.asarray(concurrency).T, jnp.float32), jnp.asarray(weights.T, jnp.float32),
                              jnp.float32(target_tok_s_user), jnp.float32(step_size or space.refine_step_size))
    x = np.asarray(lo, np.float64) + np.asarray(u, np.float64) * (np.asarray(hi, np.float64) - np.asarray(lo))
    out = {a: np.asarray(start[a], np.float64).copy() for a in AXES}
    for i, a in enumerate(REFINE_AXES):
        lo_a, hi_a = bounds[a]  # rounding must not step outside the box (a limit is often where the climb ends)
        out[a] = np.clip(np.asarray([float(f"{v:.6g}") for v in x[:, i]]), lo_a, hi_a)
    for a in ("compute_dies", "hbm_stacks", "scaleup_domain_chips"):
        out[a] = np.round(out[a])
    return out, np.asarray(j_start), np.asarray(j_end)
