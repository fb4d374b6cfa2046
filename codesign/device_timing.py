"""Timing JAX calls on the local device: warm-up, block until ready, a statistic of repeats (the way
``codesign.execute`` and its micro-benchmarks time everything).

- :func:`wall_samples`: one blocked run at a time (a host round trip per run; right for XLA:CPU and for steps);
- :func:`pipelined_samples`: runs issued back to back and blocked once (a GPU's own kernel time);
- :func:`interleaved_samples` / :func:`interleaved`: several calls measured in rounds, so a slow spell of a shared
  machine lands on all alike.
"""

from __future__ import annotations

import time

import numpy as np


def wall_samples(fn, args, repeats: int, warmup: int = 1, fresh=None) -> np.ndarray:
    """Wall times of ``repeats`` runs of ``fn(*args)`` (each blocked until ready), after one compiling run and
    ``warmup`` more. ``fresh(args) -> args`` prepares each run's arguments outside the timed region (donated
    buffers)."""
    import jax

    def once():
        a = fresh(args) if fresh else args
        if fresh:
            jax.block_until_ready(a)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*a))
        return time.perf_counter() - t0

    once()
    for _ in range(warmup):
        once()
    return np.asarray([once() for _ in range(repeats)])


def pipelined_samples(fn, args, repeats: int, warmup: int = 1, fresh=None, rounds: int = 3) -> np.ndarray:
    """Per-run wall times of ``fn(*args)`` issued ``repeats`` times back to back and blocked once (``rounds``
    samples, each the round's time / ``repeats``). A GPU runs a queue of launches without waiting for the host,
    so this is the kernel's own time; :func:`wall_samples` adds a host round trip (10-40 us) to every run, which is
    most of a microsecond-scale kernel's time on a GPU. Not for XLA:CPU, whose dispatch may run independent
    calls concurrently. ``fresh`` prepares every run's arguments before the round (donated buffers)."""
    import jax

    for _ in range(1 + warmup):
        jax.block_until_ready(fn(*(fresh(args) if fresh else args)))
    out = []
    for _ in range(rounds):
        sets = [fresh(args) if fresh else args for _ in range(repeats)]
        jax.block_until_ready(sets)
        t0 = time.perf_counter()
        jax.block_until_ready([fn(*a) for a in sets])
        out.append((time.perf_counter() - t0) / repeats)
    return np.asarray(out)


STATS = ("median", "min")


def statistic(samples, stat: str) -> float:
    return float(np.median(samples) if stat == "median" else np.min(samples))


def timed(fn, args, repeats: int, warmup: int = 1, fresh=None, stat: str = "median") -> float:
    return statistic(wall_samples(fn, args, repeats, warmup, fresh), stat)


def interleaved_samples(calls, repeats: int, warmup: int = 1) -> list[np.ndarray]:
    """Wall times of several ``(fn, args)`` measured in rounds (each compiled and warmed first, then one run of
    each per round): a slow spell of a shared machine then lands on every call alike instead of on whichever call
    happened to run during it, which matters when the calls are compared with one another (the GEMM row sweep
    against the streaming bandwidth, a step against the micro-benchmarks that predict it). On the 2-core VM this
    was built on, the achievable DRAM bandwidth switches between ~28 and ~44 GB/s in spells of several seconds
    while the matmul rate holds at ~200 GFLOP/s (2026-12-07): a memory-bound decode step timed a minute after the
    bandwidth benchmark read 0.76x-1.59x of its prediction from one run to the next."""
    import jax

    for fn, args in calls:
        for _ in range(1 + warmup):
            jax.block_until_ready(fn(*args))
    samples = [[] for _ in calls]
    for _ in range(repeats):
        for i, (fn, args) in enumerate(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[i].append(time.perf_counter() - t0)
    return [np.asarray(x) for x in samples]


def interleaved(calls, repeats: int, warmup: int = 1, stat: str = "median") -> list[float]:
    """The statistic of each call's :func:`interleaved_samples`."""
    return [statistic(x, stat) for x in interleaved_samples(calls, repeats, warmup)]
