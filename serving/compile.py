"""How the serving model's programs are compiled: ``jax.jit`` with the XLA options that keep them right.

XLA:CPU (jaxlib 0.10.2) hands some reductions to YNNPACK as library fusions (``__ynn_fusion`` in the optimised HLO,
made by the ``dot-library-rewriter`` pass; ``xla_cpu_experimental_ynn_fusion_type``'s ``reduce`` and ``eltwise``
kinds). At commit 4e1bad3 those fusions gave rows of the sweep's vmapped batch other rows' values: up to 66% of a
design's TPOT went missing (docs/fidelity.md, "Batched evaluation was miscompiled"). Root-caused 2026-12-07 on
the exported program of that commit (``tests/serving/fixtures/ynn_miscompile/``, which holds a stand-alone repro
for an upstream report): disabling the ``dot-library-rewriter`` pass, or the YNN fusions alone, or the ``algsimp``
pass (which shapes what reaches them) makes it right, and no other of ~20 passes tried does; the ``reduce`` or
``eltwise`` kind alone still breaks it, the dot kinds alone do not.

So every program of the serving model is compiled on the CPU with YNN fusions off (the option empty: XLA's own loop
emitters). That is also faster: ``python -m codesign.bench suite=serving`` (10,000 Gen 2 designs x 15 mappings x 11
concurrencies in one batch) evaluates 3.4-3.7M points/s with them off against 0.98-1.08M with them on (two runs each,
alternating, 2026-12-07, this 2-core VM); the default study's results are identical and its time unchanged (57 s,
dominated by compiling and reporting). Other backends, and a jaxlib that no longer knows the option, compile as
plain ``jax.jit``: the batch check in ``sweeps/runner.py`` stays either way. The device benchmarks of
``codesign.execute`` keep plain ``jax.jit``: they measure what the device does by default.
"""

from __future__ import annotations

import functools

import jax

# empty: no YNNPACK library fusion of any kind (the option lists the kinds to form)
CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}

_chosen: list = []  # the options for this process, decided on first compile (the backend is known only then)


def compiler_options() -> dict:
    """The options this process's serving programs compile with: :data:`CPU_OPTIONS` on a CPU backend whose jaxlib
    accepts them, else none."""
    if not _chosen:
        options: dict = {}
        if jax.default_backend() == "cpu":
            try:  # a trivial program: an unknown option fails its compile, not a real one's
                jax.jit(lambda x: x + 1, compiler_options=CPU_OPTIONS)(1.0).block_until_ready()
                options = dict(CPU_OPTIONS)
            except Exception:  # noqa: BLE001 (the option left jaxlib: compile plainly, the runner's check remains)
                options = {}
        _chosen.append(options)
    return dict(_chosen[0])


def jit(fun=None, **kwargs):
    """``jax.jit(fun, **kwargs)`` compiled with :func:`compiler_options`; usable as ``@jit`` or
    ``@functools.partial(jit, static_argnames=...)``. Called inside another trace (one serving program calling
    another, or under ``jax.grad``), it is a plain ``jax.jit``: jax takes compiler options only at the top level,
    where the outer program's apply. The jitted functions are built on the first call, when the backend is known
    (importing a serving module must not initialise one)."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    built: dict = {}

    def jitted(top: bool):
        if top not in built:
            options = compiler_options() if top else {}  # passed only when set: an older jax.jit has no such argument
            built[top] = jax.jit(fun, **kwargs, **({"compiler_options": options} if options else {}))
        return built[top]

    def traced(args, kw) -> bool:
        return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kw)))

    @functools.wraps(fun)
    def call(*args, **kw):
        return jitted(not traced(args, kw))(*args, **kw)

    call.lower = lambda *args, **kw: jitted(True).lower(*args, **kw)  # as jax.jit's: the compiled HLO can be read
    return call


__all__ = ["CPU_OPTIONS", "compiler_options", "jit"]
