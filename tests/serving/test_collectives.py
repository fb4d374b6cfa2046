"""Collective times (serving/collectives.py) against hand-computed alpha-beta costs and exhaustive enumeration."""

import pytest

from serving.collectives import allreduce_time


@pytest.mark.parametrize("msg, expected", [
    # 1 GB over 8 ranks: the ring moves 2 x 7/8 GB per rank in 14 latency hops, the tree 2 GB in 2 log2(8) = 6:
    # bandwidth dominates, the ring wins
    (1e9, 2 * 7 / 8 * 1e9 / 100e9 + 14 * 1e-6),
    # 1 KB: latency dominates, the tree's 6 hops beat the ring's 14
    (1e3, 2 * 1e3 / 100e9 + 6 * 1e-6),
])
def test_allreduce_takes_the_faster_of_ring_and_tree(msg, expected):
    assert float(allreduce_time(msg, 8.0, 100e9, 1e-6)) == pytest.approx(expected, rel=1e-6)


def test_allreduce_over_one_rank_costs_nothing():
    assert float(allreduce_time(1e9, 1.0, 100e9, 1e-6)) == 0.0


def test_remote_nodes_matches_exhaustive_enumeration():
    import itertools

    from serving.collectives import remote_nodes

    for nodes, k in ((2, 1), (2, 8), (3, 4), (4, 3), (5, 2)):
        # each of the k experts on a node drawn uniformly; count the distinct nodes other than the token's (node 0)
        outcomes = list(itertools.product(range(nodes), repeat=k))
        exact = sum(len(set(o) - {0}) for o in outcomes) / len(outcomes)
        assert float(remote_nodes(float(k), float(nodes))) == pytest.approx(exact, rel=1e-5)


def test_ep_alltoall_inside_a_domain_and_across_nodes():
    from serving.collectives import alltoall_time, ep_alltoall_time

    tokens, k, tb, up, up_lat, out, out_lat = 1024.0, 8.0, 7168.0, 450e9, 1e-6, 50e9, 5e-6
    # inside one scale-up domain: the k (ep - 1) / ep copies that leave the rank, one level
    t = float(ep_alltoall_time(tokens, k, 8.0, 8.0, tb, up, up_lat, out, out_lat))
    assert t == pytest.approx(float(alltoall_time(tokens * k * tb * 7 / 8, 8.0, up, up_lat)), rel=1e-6)
    assert float(ep_alltoall_time(tokens, k, 1.0, 8.0, tb, up, up_lat, out, out_lat)) == 0.0
    # EP 16 over two 8-chip nodes: a token crosses the scale-out network once if any of its 8 experts is on the
    # other node (probability 1 - 2^-8), scale-up carries the in-node copies and forwards; slower fabric wins
    t = float(ep_alltoall_time(tokens, k, 16.0, 8.0, tb, up, up_lat, out, out_lat))
    scale_out = tokens * (1 - 0.5 ** 8) * tb / out
    scale_up = tokens * k * tb * 15 / 16 / up
    assert t == pytest.approx(max(scale_out, scale_up) + 3 * up_lat + 1 * out_lat, rel=1e-6)
    # dedup: far less than sending every remote copy over the NIC, which the one-level model charged
    assert t < 0.25 * tokens * k * tb * 15 / 16 / out
