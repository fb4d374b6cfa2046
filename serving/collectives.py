"""Collective times on a chip's fabrics: the all-reduces of tensor parallelism and the all-to-all of expert
parallelism, as alpha-beta costs (bytes / bandwidth + hops x latency) that ``serving.perf`` adds to a step.

Bandwidths and latencies are the caller's (the chip's scale-up / scale-out figures times the fitted link
efficiency); every function is elementwise jnp, so a mapping grid evaluates in one call and differentiates.
"""

from __future__ import annotations

import jax.numpy as jnp


def allreduce_time(msg_bytes, n, bw, latency):
    """min(ring, double binary tree): ring 2 (n-1)/n S / bw + 2 (n-1) a (Patarasuk & Yuan 2009); tree
    2 S / bw + 2 log2(n) a (NCCL's double binary tree, Sanders et al. 2009). 0 for n = 1."""
    ring = 2.0 * (n - 1.0) / n * msg_bytes / bw + 2.0 * (n - 1.0) * latency
    tree = 2.0 * msg_bytes / bw + 2.0 * jnp.log2(jnp.maximum(n, 1.0)) * latency
    return jnp.where(n > 1.0, jnp.minimum(ring, tree), 0.0)


def alltoall_time(send_bytes, n, bw, latency):
    """One-shot all-to-all over a switched scale-up fabric: the bytes leaving a rank at link bandwidth plus one hop
    of latency per round of log2(n) (pairwise exchange pipelined by the switch; assumption, cf. DeepEP)."""
    return jnp.where(n > 1.0, send_bytes / bw + jnp.log2(jnp.maximum(n, 1.0)) * latency, 0.0)


def remote_nodes(k, nodes):
    """Expected nodes other than its own that one token's k experts land on, experts spread evenly over ``nodes``
    nodes: (nodes - 1) (1 - (1 - 1/nodes)^k)."""
    return (nodes - 1.0) * (1.0 - (1.0 - 1.0 / jnp.maximum(nodes, 1.0)) ** k)


def ep_alltoall_time(tokens, k, ep, domain, token_bytes, up_bw, up_lat, out_bw, out_lat):
    """One EP dispatch (or combine) of ``tokens`` local tokens, each to k experts on ``ep`` ranks.

    Inside one scale-up domain: the k (ep - 1) / ep copies that leave the rank at scale-up bandwidth. Across
    nodes (ep > domain), DeepEP's hierarchical kernels (DeepSeek-V3 report, sec. 3.2.2; DeepEP README): a token
    crosses the scale-out network once per remote node its experts live on, to the rank with the same local index,
    and is forwarded to the expert ranks inside that node over the scale-up fabric; the two fabrics run
    concurrently, so the time is the slower of the two plus a hop of latency per round on each."""
    nodes = jnp.maximum(ep / domain, 1.0)
    up_bytes = tokens * k * token_bytes * (ep - 1.0) / ep
    out_bytes = tokens * remote_nodes(k, nodes) * token_bytes
    wide = nodes > 1.0
    lat = jnp.log2(jnp.minimum(ep, domain)) * up_lat + jnp.where(wide, jnp.log2(nodes) * out_lat, 0.0)
    t = jnp.maximum(up_bytes / up_bw, jnp.where(wide, out_bytes / out_bw, 0.0)) + lat
    return jnp.where(ep > 1.0, t, 0.0)
