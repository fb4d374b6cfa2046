"""Running the workload's own model code on the local device and timing it: random weights, decode and prefill
steps with the KV cache donated, every kernel of a step timed on its own, and the grouped MoE kernel.

MoE experts (``moe_impl``): the model code multiplies the routed experts with ``jax.lax.ragged_dot``. On XLA:CPU
(JAX 0.10) that primitive is lowered to a dense matmul over *all* E experts with a masked [E, rows, h] left operand,
i.e. E times the FLOPs and every expert's weights read for every row; the serving model (like vLLM / MegaBlocks
fused-MoE kernels) assumes a grouped GEMM over the touched experts. ``moe_impl=grouped`` (what ``auto`` picks on CPUs) runs the same
model code with ``jax.lax.ragged_dot`` replaced, for the executed steps only, by :func:`grouped_ragged_dot`, which
multiplies each expert's rows by that expert's matrix tile by tile inside a ``while`` loop (same results; the
kernel table is always traced from the unmodified model). XLA:CPU copies each dynamically indexed expert matrix
before its dot, so the grouped kernel streams a touched expert at about half the GEMV rate (the ``expert-slice``
micro-benchmark line); ``moe_impl=native`` (``auto`` off the CPU: XLA:GPU lowers ragged_dot to a grouped GEMM,
where the loop's run-time trip count would make the device wait on the host every iteration) keeps the backend's
own lowering.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from codesign.device_timing import interleaved_samples, pipelined_samples, statistic, timed, wall_samples

if TYPE_CHECKING:
    from codesign.execute import Plan


# ================================================================================================= MoE kernel
def grouped_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """``jax.lax.ragged_dot`` as a grouped GEMM: rows ``[lhs.shape[0], K]`` sorted by group, ``rhs [G, K, N]``,
    ``group_sizes [G]``. The rows of each group are multiplied by that group's matrix in tiles of ``tile`` rows (a
    ``while`` loop over the non-empty tiles only), so only the touched experts' weights are read and the FLOPs are
    those of the rows (plus the padding of each group's last tile). ``tile`` is 1 when there are no more rows than
    groups (decode: a GEMV per row), else the power of two nearest below rows / groups, at most 64."""
    import jax
    import jax.numpy as jnp

    if group_offset is not None:
        raise NotImplementedError("grouped_ragged_dot: group_offset is not supported")
    m, k = lhs.shape
    g, _, n = rhs.shape
    out_dtype = jnp.dtype(preferred_element_type) if preferred_element_type is not None \
        else jnp.result_type(lhs, rhs)
    tile = 1 if m <= g else int(min(64, 2 ** int(np.floor(np.log2(m / g)))))
    gs = group_sizes.astype(jnp.int32)
    tiles = (gs + tile - 1) // tile
    tile_end = jnp.cumsum(tiles)
    tile_start = tile_end - tiles
    row_start = jnp.cumsum(gs) - gs
    lhs_p = jnp.concatenate([lhs, jnp.zeros((tile, k), lhs.dtype)])
    lanes = jnp.arange(tile)[:, None]

    def body(j, out):
        e = jnp.searchsorted(tile_end, j, side="right").astype(jnp.int32)
        t = j - tile_start[e]
        r0 = row_start[e] + t * tile
        x = jax.lax.dynamic_slice(lhs_p, (r0, 0), (tile, k))
        w = jax.lax.dynamic_index_in_dim(rhs, e, 0, keepdims=False)
        y = jnp.dot(x, w, precision=precision, preferred_element_type=out_dtype)
        old = jax.lax.dynamic_slice(out, (r0, 0), (tile, n))
        return jax.lax.dynamic_update_slice(out, jnp.where(lanes < gs[e] - t * tile, y, old), (r0, 0))

    out = jax.lax.fori_loop(0, tile_end[-1], body, jnp.zeros((m + tile, n), out_dtype))
    return out[:m]


@contextlib.contextmanager
def moe_kernel(impl: str):
    """Within the block, the model code's ``jax.lax.ragged_dot`` is ``impl``'s (``native``: unchanged)."""
    import jax

    if impl == "native":
        yield
        return
    saved = jax.lax.ragged_dot
    jax.lax.ragged_dot = grouped_ragged_dot
    try:
        yield
    finally:
        jax.lax.ragged_dot = saved


# ================================================================================================= measurement
def _runs(closed):
    """The step's top-level equations cut into maximal runs of one kernel: [(kernel name, jaxpr, in vars, out
    vars, donatable (input index, output index) pairs)]."""
    import jax.extend.core as jcore

    from serving.graph import _kernel_of

    jaxpr = closed.jaxpr
    names = [_kernel_of(str(e.source_info.name_stack))[0] for e in jaxpr.eqns]
    spans, start = [], 0
    for i in range(1, len(names) + 1):
        if i == len(names) or names[i] != names[start]:
            spans.append((names[start], start, i))
            start = i
    run_of = {}
    for r, (_, a, b) in enumerate(spans):
        for e in jaxpr.eqns[a:b]:
            for v in e.outvars:
                if not isinstance(v, jcore.DropVar):
                    run_of[v] = r
    needed = [set() for _ in spans]  # vars of run r used by a later run or returned
    for r, (_, a, b) in enumerate(spans):
        for e in jaxpr.eqns[a:b]:
            for v in e.invars:
                if not isinstance(v, jcore.Literal) and run_of.get(v, r) != r:
                    needed[run_of[v]].add(v)
    for v in jaxpr.outvars:
        if not isinstance(v, jcore.Literal) and v in run_of:
            needed[run_of[v]].add(v)
    out = []
    for r, (name, a, b) in enumerate(spans):
        eqns = jaxpr.eqns[a:b]
        ins, seen, defined = [], set(), set()
        for e in eqns:
            for v in e.invars:
                if not isinstance(v, jcore.Literal) and v not in defined and v not in seen:
                    seen.add(v)
                    ins.append(v)
            defined.update(v for v in e.outvars if not isinstance(v, jcore.DropVar))
        outs = [v for e in eqns for v in e.outvars if v in needed[r]]
        if not outs:
            outs = [v for v in eqns[-1].outvars if not isinstance(v, jcore.DropVar)]
        pairs = []
        for e in eqns:  # a cache written in place: donate the input buffer, as the step does
            if e.primitive.name == "dynamic_update_slice" and e.invars[0] in ins and e.outvars[0] in outs:
                pairs.append((ins.index(e.invars[0]), outs.index(e.outvars[0])))
        effects = frozenset().union(*(e.effects for e in eqns))
        sub = jcore.Jaxpr(constvars=[], invars=ins, outvars=outs, eqns=eqns, effects=effects)
        out.append((name, sub, ins, outs, pairs))
    return out


def time_kernels(fn, args, repeats: int, warmup: int, stat: str = "median", pipelined: bool | None = None) -> dict:
    """Every kernel of the step ``fn(*args)`` jitted and timed on its own, on the step's own intermediate values:
    {kernel name: seconds} (a kernel cut into several runs sums them). ``pipelined`` (default: off the CPU) times
    ``repeats`` runs issued back to back (:func:`~codesign.device_timing.pipelined_samples`) instead of one
    host-blocked run at a time."""
    import jax
    import jax.numpy as jnp

    if pipelined is None:
        pipelined = jax.default_backend() != "cpu"

    with jax.disable_jit():  # inline the models' jitted decoder blocks: kernels are cut from one flat jaxpr
        closed = jax.make_jaxpr(fn)(*args)
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, jax.tree.leaves(args)))
    times: dict = {}
    for name, sub, ins, outs, pairs in _runs(closed):
        run = functools.partial(jax.core.eval_jaxpr, sub, [])
        donate = tuple(sorted({i for i, _ in pairs}))
        jitted = jax.jit(run, donate_argnums=donate)
        vals = [env[v] for v in ins]
        copies = (lambda a: [jnp.copy(x) if i in donate else x for i, x in enumerate(a)]) if donate else None
        first = jitted(*(copies(vals) if copies else vals))
        env.update(zip(outs, first))
        t = (statistic(pipelined_samples(jitted, vals, repeats, warmup, fresh=copies), stat) if pipelined
             else timed(jitted, vals, repeats, warmup, fresh=copies, stat=stat))
        times[name] = times.get(name, 0.0) + t
        del first
    return times


POOL = 1 << 24  # random values every weight leaf is cut from (64 MiB of float32)


def random_params(model, key, dtype):
    """Random weights in the tree ``model.init`` builds: N(0, 0.02^2) values (the GQA models' own recipe), norm
    weights 1. Each leaf is a window at a random offset into one pool of ``POOL`` draws, tiled to the leaf's size
    (leaves smaller than the pool, such as routers, biases and sinks, are distinct draws). Drawing billions of
    normals takes minutes on a CPU and the models' one-computation ``init`` needs two to three times the weights
    in memory at full width (gpt-oss-20b's two layers in float32, 10 GiB of weights, did not initialise in 23 GiB);
    the values do not change the timing."""
    import jax
    import jax.numpy as jnp

    k_pool, k_off = jax.random.split(key)
    pool = 0.02 * jax.random.normal(k_pool, (POOL,), jnp.float32)
    shapes = jax.eval_shape(functools.partial(model.init, dtype=dtype), key)
    paths, tree = jax.tree_util.tree_flatten_with_path(shapes)
    offsets = np.asarray(jax.random.randint(k_off, (len(paths),), 0, POOL))

    @functools.partial(jax.jit, static_argnums=(2, 3))
    def window(pool, off, shape, dt):
        size = math.prod(shape)
        reps = -(-size // POOL)
        return jnp.tile(jnp.roll(pool, -off), reps)[:size].reshape(shape).astype(dt)

    out = []
    for off, (path, leaf) in zip(offsets, paths):
        last = str(getattr(path[-1], "key", getattr(path[-1], "idx", "")))
        if last.endswith("norm"):
            out.append(jnp.ones(leaf.shape, leaf.dtype))
        else:
            out.append(window(pool, jnp.int32(off), tuple(leaf.shape), jnp.dtype(leaf.dtype)))
        jax.block_until_ready(out[-1])
    return jax.tree.unflatten(tree, out)


def _random_cache(cache, key, dtype):
    import jax

    leaves, tree = jax.tree.flatten(cache)
    keys = jax.random.split(key, len(leaves))
    new = [jax.random.normal(k, x.shape, jax.numpy.float32).astype(dtype)
           if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(tree, new)


def _buffers(cache):
    """(float leaves, other leaves, treedef) of a cache: the KV buffers (donated) and the rest (its length)."""
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(cache)
    bufs = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    rest = [x for x in leaves if not jnp.issubdtype(x.dtype, jnp.floating)]
    return bufs, rest, tree


def _donating(step_fn, cache):
    """``step_fn(params, tokens, cache)`` jitted with the cache's KV buffers donated (updated in place) and its
    other leaves (the length) passed as they are: (jitted(params, tokens, bufs, rest), bufs, rest, rebuild)."""
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(cache)
    is_buf = [bool(jnp.issubdtype(x.dtype, jnp.floating)) for x in leaves]
    bufs, rest, _ = _buffers(cache)

    def rebuild(b, r=rest):
        it_b, it_r = iter(b), iter(r)
        return jax.tree.unflatten(tree, [next(it_b) if f else next(it_r) for f in is_buf])

    jitted = jax.jit(lambda p, t, b, r: step_fn(p, t, rebuild(b, r)), donate_argnums=(2,))
    return jitted, bufs, rest, rebuild


def step_dispatch_s(params, tokens, bufs, rest) -> tuple[float, list]:
    """The fixed cost of calling a step with this argument tree: a jitted call taking the same leaves (all kept,
    none pruned) with the KV buffers donated and handed back, the same host-side work as the step's call but no
    device work (minimum of 50 runs). A scalar-argument call (``dispatch_s`` of the micro-benchmarks) misses the
    per-leaf cost of a step with hundreds of weight leaves. Returns (seconds, the buffers, still valid)."""
    import jax

    noop = jax.jit(lambda p, t, b, r: b, donate_argnums=(2,), keep_unused=True)
    state = {"bufs": bufs}

    def once():
        state["bufs"] = noop(params, tokens, state["bufs"], rest)
        return state["bufs"]

    return float(wall_samples(once, (), 50, warmup=5).min()), state["bufs"]


def _timed_with(once, refs, plan: Plan) -> tuple[np.ndarray, list[float]]:
    """The step's wall times, measured in rounds with the reference calls ``refs`` (one run of each per round, the
    step last), and the references' times (``plan.stat`` of their runs)."""
    samples = interleaved_samples(list(refs) + [(once, ())], plan.repeats, plan.warmup)
    return samples[-1], [statistic(x, plan.stat) for x in samples[:-1]]


def measure_decode(model, params, batch: int, context: int, dtype, plan: Plan, key, refs=()) -> dict:
    """One decode step of ``batch`` sequences at ``context`` (the cache's filled length, reset every step so every
    timed step attends over the same context), KV cache donated, timed in rounds with the reference calls ``refs``
    (their times under ``reference_s``). Optionally every kernel alone."""
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(key)
    cache = _random_cache(model.init_cache(batch, context + 1, dtype), k1, dtype)
    length = jnp.asarray(context, jnp.int32)
    cache = dict(cache, length=length)
    tokens = jax.random.randint(k2, (batch, 1), 0, model.arch.vocab_size, jnp.int32)
    step, bufs, rest, rebuild = _donating(model.decode, cache)
    state = {"bufs": bufs}

    def once():
        logits, new = step(params, tokens, state["bufs"], rest)
        state["bufs"] = _buffers(new)[0]  # the updated cache, its length kept at ``context``
        return logits, state["bufs"]

    t, ref_s = _timed_with(once, refs, plan)
    out = {"phase": "decode", "batch": batch, "context": context, "measured_s": statistic(t, plan.stat),
           "measured_median_s": float(np.median(t)), "measured_min_s": float(t.min()), "reference_s": ref_s}
    out["dispatch_s"], state["bufs"] = step_dispatch_s(params, tokens, state["bufs"], rest)
    if plan.kernels:
        out["kernels_measured_s"] = time_kernels(model.decode, (params, tokens, rebuild(state["bufs"])),
                                                 plan.repeats, plan.warmup, plan.stat)
    return out


def measure_prefill(model, params, tokens_n: int, dtype, plan: Plan, key, refs=()) -> dict:
    """One prefill of ``tokens_n`` tokens (one request) into an empty, donated KV cache, timed in rounds with the
    reference calls ``refs`` (as :func:`measure_decode`)."""
    import jax
    import jax.numpy as jnp

    cache = model.init_cache(1, tokens_n, dtype)
    tokens = jax.random.randint(key, (1, tokens_n), 0, model.arch.vocab_size, jnp.int32)
    step, bufs, rest, _ = _donating(model.prefill, cache)
    state = {"bufs": bufs}

    def once():
        logits, new = step(params, tokens, state["bufs"], rest)
        state["bufs"] = _buffers(new)[0]
        return logits, state["bufs"]

    t, ref_s = _timed_with(once, refs, plan)
    out = {"phase": "prefill", "batch": 1, "tokens": tokens_n, "measured_s": statistic(t, plan.stat),
           "measured_median_s": float(np.median(t)), "measured_min_s": float(t.min()), "reference_s": ref_s}
    out["dispatch_s"], state["bufs"] = step_dispatch_s(params, tokens, state["bufs"], rest)
    if plan.kernels:
        out["kernels_measured_s"] = time_kernels(model.prefill, (params, tokens, model.init_cache(1, tokens_n, dtype)),
                                                 plan.repeats, plan.warmup, plan.stat)
    return out


