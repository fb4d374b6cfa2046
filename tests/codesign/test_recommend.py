"""Frontiers and mix-aware selection on synthetic result tables with a known Pareto set."""

import math

import numpy as np
import pyarrow as pa
import pytest

from codesign.frontier import design_axes, design_values, frontier_interp, pareto_frontier, value_at
from codesign.recommend import generation_gains, headline_lines, pareto_mask, recommend, recommend_from_meta

XS = (10.0, 50.0, 100.0, 200.0, 400.0)


def frontier_rows(design_id, kind, generation, workload, scale, x_max=400.0, *, rating_w=1000.0, extra_axis=1.0,
                  dominated=False, usd_scale=1.0):
    """Frontier points x in XS (up to x_max) with total tok/s/chip = scale * (1000 - x): value at t is exact."""
    rows = []
    for x in XS:
        if x > x_max:
            continue
        y = scale * (1000.0 - x)
        pts = [(x, y)] + ([(x * 0.9, y * 0.8)] if dominated else [])  # a point under the frontier
        for xx, yy in pts:
            rows.append(dict(
                design_id=design_id, name=f"{generation}-{design_id}" if kind == "candidate" else design_id,
                kind=kind, generation=generation, workload=workload, precision="fp4", scenario="inferencex_8k1k",
                mapping="tp1", tp=1, dp=1, ep=1, pp=1, concurrency=int(1000 / xx), feasible=True, reason="",
                interactivity_tok_s_user=xx, total_tok_s_per_chip=yy, output_tok_s_per_chip=yy / 2,
                total_tok_s_per_kw=yy / (rating_w / 1000.0), usd_per_mtok=usd_scale * 1e6 / (yy * 3600.0),
                e2e_s=10.0 + 900.0 / xx, ttft_s=10.0, tpot_s=1 / xx,
                design_compute_dies=2.0 if kind == "candidate" else float("nan"),
                design_new_axis=extra_axis if kind == "candidate" else float("nan"),
                chip_cost_usd=20000.0 if kind == "candidate" else float("nan"),
                chip_die_area_m2=1.6e-3, chip_power_rating_w=rating_w, chip_fp4_flops_per_s=2e16,
                chip_hbm_bandwidth_bytes_per_s=8e12, chip_hbm_capacity_bytes=2.88e11, chip_int8_flops_per_s=0.0))
    return rows


def infeasible_row(design_id, generation, workload):
    r = frontier_rows(design_id, "candidate", generation, workload, 1.0)[0]
    r.update(feasible=False, reason="package power above the limit", mapping="", concurrency=0)
    for k in ("interactivity_tok_s_user", "total_tok_s_per_chip", "output_tok_s_per_chip", "total_tok_s_per_kw",
              "usd_per_mtok", "e2e_s", "ttft_s", "tpot_s"):
        r[k] = float("nan")
    return [r]


# (design, generation) -> scale on workload A, scale on B, max interactivity on B
GEN2 = {"d1": (2.0, 1.0, 400), "d2": (1.0, 2.0, 400), "d3": (1.0, 1.0, 400), "d4": (2.0, 1.0, 400),
        "d5": (3.0, 1.0, 50), "d7": (0.5, 0.5, 400), "d8": (1.5, 1.5, 400)}
GEN3 = {"e1": (1.0, 1.0, 400), "e2": (0.9, 0.9, 400)}
PARETO_GEN2_AT_100 = {"d1", "d2", "d4", "d5", "d8"}
K = 1000.0 / 700.0  # per kW: candidates are rated 700 W, the baseline 1000 W


def synthetic_table(workloads=("A", "B"), dominated=False) -> pa.Table:
    rows = []
    for w in workloads:
        rows += frontier_rows("base", "baseline", "presets", w, 1.0)
        rows += frontier_rows("gb200", "competitor", "presets", w, 1.25, rating_w=1200.0)
        rows += frontier_rows("gb300", "competitor", "presets", w, 1.5, x_max=200.0, rating_w=1400.0)
        for gen, designs in (("gen2", GEN2), ("gen3", GEN3)):
            for d, (sa, sb, xb) in designs.items():
                s, xm = (sa, 400.0) if w == "A" else (sb, float(xb))
                rows += frontier_rows(d, "candidate", gen, w, s, xm, rating_w=700.0, extra_axis=float(len(d)),
                                      dominated=dominated, usd_scale=0.5)
        rows += infeasible_row("d6", "gen2", w)
    return pa.Table.from_pylist(rows)


def ids(designs):
    return {d.design_id for d in designs}


def test_pareto_frontier_and_value_at_keep_their_behaviour():
    rng = np.random.default_rng(3)
    for _ in range(50):
        x = rng.choice([1.0, 2.0, 3.0, 4.0, np.nan], 12)
        y = rng.choice([1.0, 2.0, 5.0, 7.0, np.inf], 12)
        idx = pareto_frontier(x, y)
        ok = [i for i in range(12) if np.isfinite(x[i]) and np.isfinite(y[i])]
        naive = [i for i in ok if not any((x[j] >= x[i] and y[j] >= y[i]) and (x[j] > x[i] or y[j] > y[i])
                                          for j in ok)]
        # one representative per distinct maximal point, sorted by x
        assert sorted({(x[i], y[i]) for i in idx}) == sorted({(x[i], y[i]) for i in naive})
        assert list(x[idx]) == sorted(x[idx])
    x, y = np.array([10.0, 20.0, 40.0, 15.0]), np.array([100.0, 80.0, 20.0, 50.0])
    assert value_at(x, y, 5.0) == 100.0  # below the frontier's start: its first point
    assert value_at(x, y, 30.0) == pytest.approx(50.0)  # halfway between (20, 80) and (40, 20)
    assert math.isnan(value_at(x, y, 41.0))
    assert frontier_interp(x, y, np.array([1.0, 2.0, 4.0, 9.0]), 30.0) == pytest.approx(3.0)


def test_pareto_mask_counts_unreachable_as_dominated():
    v = np.array([[2, 1], [1, 2], [1, 1], [3, np.nan], [np.nan, np.nan], [2, 1]], float)
    assert pareto_mask(v).tolist() == [True, True, False, True, False, True]


def test_mix_selection_returns_exactly_the_known_pareto_set():
    table = synthetic_table()
    rec = recommend(table, "total_tok_s_per_kw", [50, 100, 300], top_k=20, mix={"A": 1, "B": 1})
    assert rec.workloads == ["A", "B"] and rec.mix == {"A": 0.5, "B": 0.5}
    assert ids(rec.pareto["gen2"][100.0]) == PARETO_GEN2_AT_100
    # per generation: gen3's own best is Pareto-optimal there although gen2 designs beat it
    assert ids(rec.pareto["gen3"][100.0]) == {"e1"}
    # at 50 d5 reaches B too (x_max 50) and, at (3, 1), dominates d1 / d4 (2, 1)
    assert ids(rec.pareto["gen2"][50.0]) == {"d2", "d5", "d8"}
    # at 300 nobody else changes: everyone reaches 400 except d5 on B
    assert ids(rec.pareto["gen2"][300.0]) == PARETO_GEN2_AT_100
    # score: weighted geometric mean of the ratio to the baseline (scale ratios: the baseline has scale 1)
    d = {x.design_id: x for x in rec.designs}
    assert d["d8"].score[100.0] == pytest.approx(1.5 * K)
    assert d["d1"].score[100.0] == pytest.approx(math.sqrt(2.0) * K)
    assert d["d1"].worst[100.0] == pytest.approx(K)
    assert math.isnan(d["d5"].score[100.0])  # cannot reach 100 on B
    assert rec.best["gen2"].design_id == "d8" and rec.robust["gen2"][100.0].design_id == "d8"
    assert rec.ranked["gen2"][100.0][0].design_id == "d8"
    assert rec.infeasible == {"gen2": 1, "gen3": 0} and rec.unreachable["gen2"] == 1  # d6; d5
    assert {c.design_id for c in rec.competitors} == {"gb200", "gb300"}


def test_mix_weights_change_the_ranking_not_the_pareto_set():
    table = synthetic_table()
    rec = recommend(table, "total_tok_s_per_kw", [100], top_k=3, mix={"A": 0.75, "B": 0.25})
    assert ids(rec.pareto["gen2"][100.0]) == PARETO_GEN2_AT_100
    assert [x.design_id for x in rec.ranked["gen2"][100.0]] == ["d1", "d4", "d8"]  # 2^0.75 = 1.68 > 1.5
    assert rec.ranked["gen2"][100.0][0].score[100.0] == pytest.approx(2 ** 0.75 * K)
    assert rec.robust["gen2"][100.0].design_id == "d8"  # worst case 1.5 beats d1's 1.0


def test_single_workload_selection():
    table = synthetic_table(workloads=("A",))
    rec = recommend(table, "total_tok_s_per_kw", [50, 100, 200], top_k=5)
    assert rec.mix == {"A": 1.0}
    assert ids(rec.pareto["gen2"][100.0]) == {"d5"}  # the single best, as before
    assert [x.design_id for x in rec.ranked["gen2"][100.0]][:3] == ["d5", "d1", "d4"]
    assert rec.gain(rec.best["gen2"], rec.baseline) == pytest.approx(3.0 * K)
    assert rec.gain(rec.best["gen2"], rec.baseline, workload="A", metric="per_chip") == pytest.approx(3.0)
    assert any("gen2 best" in line for line in headline_lines(rec))


def test_frontier_rows_alone_give_the_same_selection():
    full = recommend(synthetic_table(dominated=True), "total_tok_s_per_kw", [50, 100, 300], top_k=20)
    front = recommend(synthetic_table(dominated=False), "total_tok_s_per_kw", [50, 100, 300], top_k=20)
    for g in ("gen2", "gen3"):
        for t in (50.0, 100.0, 300.0):
            assert ids(full.pareto[g][t]) == ids(front.pareto[g][t])
            assert [x.score[t] for x in full.ranked[g][t]] == pytest.approx([x.score[t] for x in front.ranked[g][t]],
                                                                             nan_ok=True)


def test_values_and_gains_at_matched_interactivity():
    table = synthetic_table()
    summ = {(s.design_id, s.workload): s for s in design_values(table, "total_tok_s_per_kw", [150.0])}
    s = summ[("d1", "A")]
    assert s.per_chip[150.0] == pytest.approx(2.0 * 850.0)  # interpolated between the 100 and 200 points
    assert s.per_kw[150.0] == pytest.approx(2.0 * 850.0 / 0.7)
    assert s.e2e_s[150.0] == pytest.approx((19.0 + 14.5) / 2)  # along the frontier, like value_at
    assert s.tok_per_usd[150.0] == pytest.approx(2.0 * 850.0 * 3600 / 0.5)  # 1e6 / usd_per_mtok
    assert summ[("d5", "B")].max_interactivity == 50.0
    rec = recommend(table, "total_tok_s_per_kw", [100], top_k=3, mix={"A": 1, "B": 1}, chain_steps=8)
    gains = generation_gains(rec)
    row = next(r for r in gains if r["generation"] == "gen2" and r["versus"] == "base" and r["metric"] == "per_chip"
               and r["workload"] == "A")
    assert row["design"] == "gen2-d8" and row["gain"] == pytest.approx(1.5)
    mix = next(r for r in gains if r["generation"] == "gen2" and r["versus"] == "gb200" and r["metric"] == "per_kw"
               and r["workload"] == "mix")
    assert mix["gain"] == pytest.approx(1.5 / 1.25 * (1200 / 700))
    chain = next(r for r in gains if r["generation"] == "gen2" and r["versus"] == "base" and
                 r["metric"] == "chain_latency" and r["workload"] == "B")
    # the chain runs at each design's fastest point (e2e = 10 + 900 / x, lowest at its highest x), not at the
    # target, where every design has the same TPOT: d8 and the baseline both reach 400 tok/s/user, gb300 only 200
    assert chain["design_value"] == pytest.approx(8 * (10.0 + 900.0 / 400.0)) and chain["gain"] == pytest.approx(1.0)
    chain300 = next(r for r in gains if r["generation"] == "gen2" and r["versus"] == "gb300" and
                    r["metric"] == "chain_latency" and r["workload"] == "B")
    assert chain300["gain"] == pytest.approx((10.0 + 900.0 / 200.0) / (10.0 + 900.0 / 400.0))
    assert summ[("d5", "B")].min_e2e_s == pytest.approx(10.0 + 900.0 / 50.0)
    assert math.isnan(summ[("d6", "A")].min_e2e_s)  # no feasible point
    usd = next(r for r in gains if r["generation"] == "gen2" and r["versus"] == "base" and r["metric"] == "per_usd"
               and r["workload"] == "A")
    assert usd["gain"] == pytest.approx(1.5 / 0.5)
    # gb300 cannot reach 300 tok/s/user: its gains there are n/a, except the chain latency at its fastest point
    rec3 = recommend(table, "total_tok_s_per_kw", [300], top_k=3)
    g3 = [r for r in generation_gains(rec3) if r["versus"] == "gb300"]
    assert g3 and all(math.isnan(r["gain"]) for r in g3 if r["metric"] != "chain_latency")
    assert all(r["gain"] == pytest.approx((10.0 + 900.0 / 200.0) / (10.0 + 900.0 / 400.0))
               for r in g3 if r["metric"] == "chain_latency")


def test_settings_come_from_meta_and_axes_are_discovered():
    table = synthetic_table()
    meta = {"mix": {"A": 3, "B": 1, "missing": 5}, "agent_chain_steps": 4,
            "config": {"report": {"objective": "total_tok_s_per_chip", "interactivity_targets_tok_s_user": [50, 100],
                                  "top_k": 2}}}
    rec = recommend_from_meta(table, meta)
    assert rec.objective == "total_tok_s_per_chip" and rec.targets == (50.0, 100.0) and rec.chain_steps == 4
    assert rec.mix == {"A": 0.75, "B": 0.25} and any("missing" in n for n in rec.notes)
    assert all(len(r) <= 2 for r in rec.ranked["gen2"].values())
    assert design_axes(table) == ["compute_dies", "new_axis"]


def test_baseline_that_misses_a_target_falls_back_to_the_best_design():
    table = synthetic_table()
    keep = [not (d == "base" and x > 150) for d, x in zip(table.column("design_id").to_pylist(),
                                                          table.column("interactivity_tok_s_user").to_pylist())]
    rec = recommend(table.filter(pa.array(keep)), "total_tok_s_per_kw", [100, 300], top_k=3)
    assert rec.reference[300.0]["A"][0].startswith("best design")
    assert rec.best["gen2"] is not None and np.isfinite(rec.best["gen2"].score[300.0])


def test_a_reference_near_its_interactivity_ceiling_is_flagged():
    import pyarrow as pa

    from codesign.recommend import recommend

    rows = []
    for did, kind, gen, xs in [("base", "baseline", "presets", (10, 60, 110)),
                               ("cand", "candidate", "gen2", (10, 100, 300))]:
        for i, x in enumerate(xs):
            rows.append({"design_id": did, "name": did, "kind": kind, "generation": gen, "workload": "w",
                         "feasible": True, "interactivity_tok_s_user": float(x),
                         "total_tok_s_per_kw": 1000.0 / (1 + i), "total_tok_s_per_chip": 1000.0 / (1 + i),
                         "usd_per_mtok": 1.0 + i, "e2e_s": 10.0 / x})
    table = pa.Table.from_pylist(rows)
    rec = recommend(table, "total_tok_s_per_kw", (50.0, 100.0), 3)
    assert any("base reaches at most 110 tok/s/user on w" in n for n in rec.notes)
    rec = recommend(table, "total_tok_s_per_kw", (10.0, 50.0), 3, headline_target=50.0)
    assert not any("reaches at most" in n for n in rec.notes)  # 110 is well above 50


def test_where_no_design_reaches_the_whole_mix_the_ranking_follows_what_they_reach():
    # every candidate reaches only 50 tok/s/user on B: at 100 none has a whole-mix score. "a1" sorts first by id
    # and is dominated by "z9" on A; "m5" reaches neither workload at 100
    rows = []
    for w in ("A", "B"):
        rows += frontier_rows("base", "baseline", "presets", w, 1.0)
        for d, scale, xa in (("a1", 1.0, 400.0), ("z9", 3.0, 400.0), ("k4", 2.0, 400.0), ("m5", 9.0, 50.0)):
            rows += frontier_rows(d, "candidate", "gen2", w, scale, xa if w == "A" else 50.0, rating_w=700.0)
    table = pa.Table.from_pylist(rows)
    rec = recommend(table, "total_tok_s_per_kw", [50, 100], top_k=5, mix={"A": 1, "B": 1})
    ranked = rec.ranked["gen2"][100.0]
    assert [d.design_id for d in ranked] == ["z9", "k4", "a1"]  # m5 reaches nothing at 100: not ranked
    assert all(math.isnan(d.score[100.0]) for d in ranked)
    assert ranked[0].partial[100.0] == pytest.approx(3.0 * K)  # A alone, against the baseline
    assert ids(rec.pareto["gen2"][100.0]) == {"z9"} and ranked[0].pareto[100.0]
    # at 50 everyone reaches both: the whole-mix score decides, m5 first
    assert rec.ranked["gen2"][50.0][0].design_id == "m5"
    from codesign.report_tables import selection_table
    _, rows_ = selection_table(rec)
    top = next(r for r in rows_ if r[1] == "100" and r[2] == "1")
    assert "z9" in top[3] and top[4] == f"n/a ({3.0 * K:.2f}x on 1 of 2)" and top[6] == "yes"
