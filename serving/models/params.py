"""Parameters described before they are drawn: a pytree of :class:`ParamSpec` leaves (shape plus how to draw it)
that the MLA models and the vision tower build, so ``jax.eval_shape`` sees full-size parameters without allocating
them and a small test model draws all of its random weights in one RNG kernel (:func:`materialize`)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter before it is drawn: ``N(0, std^2)`` when ``std`` is set, else the constant ``value``."""
    shape: tuple[int, ...]
    std: float | None = None
    value: float = 0.0


def normal(shape, fan_in) -> ParamSpec:
    """A weight ``N(0, 1/fan_in)`` (activations stay O(1) through the tiny test models)."""
    return ParamSpec(tuple(shape), std=float(fan_in) ** -0.5)


def const(shape, value) -> ParamSpec:
    return ParamSpec(tuple(shape), value=float(value))


def materialize(specs, key, dtype):
    """The arrays of a pytree of :class:`ParamSpec`. All random leaves are slices of *one* flat normal draw: one
    RNG kernel to compile instead of one per distinct shape (which made small inits take tens of seconds on CPU).
    Under ``jax.eval_shape`` nothing is drawn, at any size."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=lambda x: isinstance(x, ParamSpec))
    total = sum(math.prod(s.shape) for s in leaves if s.std is not None)
    flat = jax.random.normal(key, (total,), jnp.float32)
    out, offset = [], 0
    for s in leaves:
        if s.std is None:
            out.append(jnp.full(s.shape, s.value, dtype))
            continue
        n = math.prod(s.shape)
        out.append((jax.lax.slice(flat, (offset,), (offset + n,)).reshape(s.shape) * s.std).astype(dtype))
        offset += n
    return treedef.unflatten(out)
