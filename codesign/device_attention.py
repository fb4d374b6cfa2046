"""The device's attention curve: the model code's own attention, timed at a decode step's shape over the query rows
of one sequence, and fitted to the serving model's attention form (``python -m codesign.execute`` prints it).

The serving model prices a sequence's attention at ``e_max x rows / (rows + attention_rows_half)`` of the chip's
math rate, or at its KV stream, whichever is slower (``serving/perf.py``; rows = the query heads sharing one KV head
x the query tokens). ``execute`` keeps that curve as configured in every mode (codesign/device_bench.py): attention is
the serving model's claim under test, and its per-class rows show how it fares. This sweep measures the device's
side: q ``[B, 1, Hkv x g, d]`` against a ``[B, C, Hkv, d]`` cache for g = 1 .. 64 query heads per KV head (the rows),
through ``serving.models.common.attention`` (the code every GQA workload's steps run: unfused einsums, mask and
softmax, as XLA compiles them), at the run's largest decode batch and its context. :func:`fit_attention_curve` fits
``e_max`` and ``rows_half`` to it against the device's measured matmul rate and stream bandwidth. On this VM's CPU it
finds attention far below the matmul rate (a few %, growing with g), which is what the per-class attention rows
show; on a GPU it is the curve of XLA's attention, not of a serving engine's fused kernel (FlashAttention, cuDNN):
a check beside the config's ``attention_rows_half``, not a measurement of the engines' value.
"""

from __future__ import annotations

import numpy as np

from codesign.device_timing import timed

GROUPS = (1, 2, 4, 8, 16, 32, 64)  # query heads per KV head: a decode step's rows of one sequence
KV_HEADS, HEAD_DIM = 8, 128  # Llama 3 / Qwen3 / gpt-oss-like GQA (models.md): 8 KV heads of 128 (gpt-oss: 64)


def attention_sweep(dtype, batch: int, context: int, reps: int, stat: str) -> dict:
    """Times of one decode step's attention over ``context`` cached keys for ``batch`` sequences, per group size
    g in :data:`GROUPS`, with the FLOPs (QK^T and PV, 2 per multiply-add) and KV bytes each moves."""
    import jax
    import jax.numpy as jnp

    from serving.models.common import attention

    slots = jnp.arange(context)
    pos = jnp.full((batch, 1), context - 1)
    f = jax.jit(lambda q, k, v: attention(q, k, v, q_positions=pos, k_positions=slots, k_valid=slots < context,
                                          scale=HEAD_DIM ** -0.5))
    kk, kv = jax.random.split(jax.random.key(1))
    k = jax.random.normal(kk, (batch, context, KV_HEADS, HEAD_DIM), dtype)
    v = jax.random.normal(kv, (batch, context, KV_HEADS, HEAD_DIM), dtype)
    seconds, flops = [], []
    for g in GROUPS:
        q = jax.random.normal(jax.random.key(g), (batch, 1, KV_HEADS * g, HEAD_DIM), dtype)
        seconds.append(timed(f, (q, k, v), max(reps, 5), stat=stat))
        flops.append(2.0 * 2.0 * batch * KV_HEADS * g * context * HEAD_DIM)
        del q
    kv_bytes = 2.0 * k.nbytes
    return {"batch": batch, "context": context, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "rows": list(GROUPS),
            "seconds": seconds, "flops": flops, "kv_bytes": kv_bytes, "dtype": jnp.dtype(dtype).name}


def fit_attention_curve(sweep: dict, rate_flops_per_s: float, bandwidth_bytes_per_s: float) -> dict:
    """Fit t(g) = max(flops / (rate x e_max x g / (g + rows_half)), kv_bytes / bandwidth) to an
    :func:`attention_sweep`: least squares of log time over a grid of e_max (1e-4 .. 1.5, log-spaced) and
    rows_half (0 and 0.1 .. 1e4, log-spaced), refined on a finer grid around its best point. Also the share of the
    matmul rate each point reached."""
    g = np.asarray(sweep["rows"], np.float64)
    t = np.asarray(sweep["seconds"], np.float64)
    flops = np.asarray(sweep["flops"], np.float64)
    t_mem = sweep["kv_bytes"] / bandwidth_bytes_per_s

    def curve(e, h):  # the serving model's attention time at each group size
        return np.maximum(flops / (rate_flops_per_s * e) * (1.0 + h / g), t_mem)

    def best(e, h):  # the grid point (e_max, rows_half) of least squared log error
        err = np.sum((np.log(curve(e[:, None, None], h[None, :, None])) - np.log(t)) ** 2, axis=2)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        return e[i], h[j]

    # a coarse grid (4% / 6% steps), then a fine one around its best point (0.1% steps)
    e0, h0 = best(np.logspace(-4, np.log10(1.5), 241), np.concatenate([[0.0], np.logspace(-1, 4, 201)]))
    fine = np.logspace(-0.06, 0.06, 121)
    e1, h1 = best(e0 * fine, np.concatenate([[0.0], max(h0, 0.1) * fine]) if h0 < 0.2 else h0 * fine)
    model = curve(e1, h1)
    return {"attention_efficiency_max": float(e1), "attention_rows_half": float(h1),
            "predicted_over_measured": [float(x) for x in model / t],
            "share_of_matmul_rate": [float(x) for x in flops / t / rate_flops_per_s]}


def describe(sweep: dict, fit: dict) -> str:
    """One line for ``execute``'s table (``fit`` as ``execute`` reports it, with ``config_attention_rows_half``)."""
    pts = ", ".join(f"{r} {s * 1e3:.2f} ms ({share * 100:.1f}%)"
                    for r, s, share in zip(sweep["rows"], sweep["seconds"], fit["share_of_matmul_rate"]))
    ratios = fit["predicted_over_measured"]
    return (f"attention sweep q[{sweep['batch']}, 1, {sweep['kv_heads']} x g, {sweep['head_dim']}] over "
            f"{sweep['context']} keys (the model code's attention): g = {pts} of the matmul rate; e_max x g / "
            f"(g + rows_half) fits e_max {fit['attention_efficiency_max']:.3f}, rows_half "
            f"{fit['attention_rows_half']:.1f} (pred/meas {min(ratios):.2f}..{max(ratios):.2f}; the serving "
            f"config's attention_rows_half {fit['config_attention_rows_half']:.0f}, kept: attention is the claim under test)")


__all__ = ["GROUPS", "attention_sweep", "describe", "fit_attention_curve"]
