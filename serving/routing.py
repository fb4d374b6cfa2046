"""Routing statistics of a MoE step, vectorisable and differentiable: how many experts its tokens touch and how
unevenly the expert-parallel ranks share them (the busiest rank sets the step's pace).

Uniform routing (each token picks k of E experts; ``serving/graph_parallel.py`` has the skewed, Zipf-like version
the operator graph reports): the tokens' expert assignments per rank for the FLOPs (:func:`ep_imbalance`), and the
touched experts per rank, whose weights each rank streams (:func:`busiest_rank_experts`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special


def expected_experts(num_experts, k, tokens):
    """E (1 - (1 - k/E)^T): distinct experts hit by T uniformly routed tokens."""
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def ep_imbalance(tokens, k, ep):
    """Busiest / mean EP-rank load for uniform routing: Gaussian max bound mu + sigma sqrt(2 ln ep) over the mean
    (as serving/graph_parallel.load_imbalance with skew 0)."""
    n = jnp.maximum(tokens * k, 1e-9)
    ep_safe = jnp.where(ep > 1.0, ep, 2.0)  # the ep = 1 branch is discarded, but its sqrt(0) would NaN the gradient
    q = 1.0 / ep_safe
    mu = n * q
    sigma = jnp.sqrt(n * q * (1.0 - q))
    return jnp.where(ep > 1.0, 1.0 + sigma * jnp.sqrt(2.0 * jnp.log(ep_safe)) / mu, 1.0)


def busiest_rank_experts(num_experts, k, tokens, ep):
    """Expected touched experts on the busiest EP rank, whose weights it streams while the others wait. Each rank
    holds E / ep experts, each touched with probability pi = 1 - (1 - k/E)^T, so a rank's count is ~Binomial(E / ep,
    pi) and the busiest of ep is mean + sd x z_ep, z_ep = Phi^-1((ep - 0.375) / (ep + 0.25)) (Blom 1958: the
    expected largest of ep standard normals, 1.43 at ep = 8 against the exact 1.42), at most E / ep. At one token of
    DeepSeek-R1 on 8 ranks (8 of 256 experts) that is 2.4 experts where the mean is 1 (simulated: 2.55): a low-batch
    step reads ~2.4x the expert weights the mean implies on its slowest rank. ep = 1: every touched expert."""
    touched = expected_experts(num_experts, k, tokens)
    ep_safe = jnp.where(ep > 1.0, ep, 2.0)  # the ep = 1 branch is discarded; this keeps its discarded values finite
    per = num_experts / ep_safe
    pi = touched / num_experts
    mean = per * pi
    sd = jnp.sqrt(jnp.maximum(per * pi * (1.0 - pi), 1e-12))
    z = jax.scipy.special.ndtri((ep_safe - 0.375) / (ep_safe + 0.25))
    return jnp.where(ep > 1.0, jnp.where(pi > 0.0, jnp.minimum(mean + sd * z, per), 0.0), touched)


__all__ = ["expected_experts", "ep_imbalance", "busiest_rank_experts"]
