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
