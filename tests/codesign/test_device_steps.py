"""The grouped MoE kernel that ``codesign.execute`` runs in place of XLA:CPU's ragged_dot, against ragged_dot itself
(the oracle: JAX's own primitive on the same operands)."""

import numpy as np


def test_grouped_ragged_dot_equals_ragged_dot():
    import jax
    import jax.numpy as jnp

    from codesign.device_steps import grouped_ragged_dot

    rng = np.random.default_rng(0)
    for rows, groups in ((5, 8), (40, 4), (64, 3)):  # tile 1 (rows <= groups), tiles of 8 and 16 rows
        sizes = rng.multinomial(rows, np.ones(groups) / groups)
        sizes[0] = 0 if groups > 3 else sizes[0]  # an empty group
        sizes[-1] += rows - sizes.sum()
        lhs = jnp.asarray(rng.normal(size=(rows, 16)), jnp.float32)
        rhs = jnp.asarray(rng.normal(size=(groups, 16, 12)), jnp.float32)
        gs = jnp.asarray(sizes, jnp.int32)
        want = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32)
        got = jax.jit(grouped_ragged_dot, static_argnames="preferred_element_type")(
            lhs, rhs, gs, preferred_element_type=jnp.float32)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_kernels_timed_back_to_back_cover_the_same_kernels_as_one_at_a_time():
    """The GPU way of timing kernels (runs issued back to back, blocked once) on this CPU: the same kernels, a
    positive time each, the donated cache kernel fed a fresh copy every run (a reused donated buffer would raise),
    and the big matmul's time within a factor of three of the host-blocked one (both are its compute here)."""
    import jax
    import jax.numpy as jnp

    from codesign.device_timing import pipelined_samples, wall_samples
    from codesign.device_steps import time_kernels

    def step(x, w, cache):
        with jax.named_scope("proj"):
            y = jnp.tanh(x @ w)
        with jax.named_scope("kv_write"):
            cache = jax.lax.dynamic_update_slice(cache, y[:, :8], (0, 0))
        return y.sum(), cache

    x, w, cache = jnp.ones((256, 512)), jnp.ones((512, 512)) * 1e-3, jnp.zeros((256, 64))
    blocked = time_kernels(step, (x, w, cache), repeats=3, warmup=1, pipelined=False)
    queued = time_kernels(step, (x, w, cache), repeats=3, warmup=1, pipelined=True)
    assert set(blocked) == set(queued) and len(queued) >= 2
    assert all(np.isfinite(t) and t > 0 for t in queued.values())
    mm = jax.jit(lambda a, b: a @ b)
    a = jnp.ones((1024, 1024))
    t_queued = np.median(pipelined_samples(mm, (a, a), repeats=4, rounds=3))
    t_blocked = np.median(wall_samples(mm, (a, a), repeats=5))
    assert t_blocked / 3 < t_queued < 3 * t_blocked
