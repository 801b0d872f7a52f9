"""The pipeline-schedule simulator against the closed forms of pipeline.py and hand-computed schedules."""
import itertools

import pytest

from ninefold.analysis.cost_model import pipeline as PL
from ninefold.analysis.cost_model.schedule_sim import simulate

GRID = list(itertools.product((2, 4, 8), (4, 8, 16)))


def check_dependencies(r, t_p2p):
    """Every task starts after its inputs (re-derived here, not taken from the simulator) and no stage runs
    two tasks at once."""
    p, v = r.p, r.v
    for (kind, s, c, i), st in r.start.items():
        if kind == "F":
            if s > 0:
                dep, hop = ("F", s - 1, c, i), t_p2p
            elif c > 0:
                dep, hop = ("F", p - 1, c - 1, i), (t_p2p if p > 1 else 0)
            else:
                dep = None
        elif kind == "B":
            if s < p - 1:
                dep, hop = ("B", s + 1, c, i), t_p2p
            elif c < v - 1:
                dep, hop = ("B", 0, c + 1, i), (t_p2p if p > 1 else 0)
            else:
                dep, hop = ("F", s, c, i), 0
        else:
            dep, hop = ("B", s, c, i), 0
        if dep is not None:
            assert st >= r.end[dep] + hop - 1e-9, ((kind, s, c, i), dep)
        assert r.end[(kind, s, c, i)] > st
    for s in range(p):
        spans = sorted((r.start[t], r.end[t]) for t in r.order[s])
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-9
    # every task of the step ran exactly once
    kinds = "FBW" if r.schedule == "zero-bubble" else "FB"
    assert set(r.start) == {(k, s, c, i) for k in kinds for s in range(p) for c in range(v) for i in range(r.m)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
def test_gpipe_1f1b_closed_form(schedule, p, m):
    t_f, t_b = 1.0, 2.0
    r = simulate(schedule, p, m, t_f=t_f, t_b=t_b)
    assert r.makespan == pytest.approx((m + p - 1) * (t_f + t_b))
    for s in range(p):
        assert r.busy[s] == pytest.approx(m * (t_f + t_b))
        assert r.idle[s] == pytest.approx(PL.bubble_time(schedule, p, m, t_f, t_b, 0.0))
        assert r.bubble_fraction[s] == pytest.approx((p - 1) / (m + p - 1))
        assert r.bubble_fraction[s] == pytest.approx(PL.bubble_fraction(schedule, p, m, 1, t_f, t_b, 0.0))
    check_dependencies(r, 0.0)


def test_1f1b_order_and_t_w_folded_into_backward():
    r = simulate("1f1b", 4, 8, t_f=1.0, t_b=1.0, t_w=1.0)
    # warm-up p − s − 1 forwards on stage s, then alternation
    for s in range(4):
        kinds = "".join(k for k, *_ in r.order[s])
        assert kinds == "F" * (3 - s) + "FB" * (8 - 3 + s) + "B" * (3 - s)
    assert r.makespan == pytest.approx((8 + 3) * 3.0)
    assert r.busy == pytest.approx([8 * 3.0] * 4)


@pytest.mark.parametrize("p,m", [(p, m) for p, m in GRID if m % p == 0])
@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize("t_b", [1.0, 2.0])
def test_interleaved_closed_form(p, m, v, t_b):
    # pipeline.py: bubble (p−1)(t_f + t_b + t_w)/v (Narayanan et al. 2021 §2.2.2); with Megatron's order and
    # m a multiple of p the simulation hits it exactly (no tolerance needed), for t_b = t_f and t_b = 2 t_f
    t_f = 1.0
    r = simulate("interleaved", p, m, v, t_f=t_f, t_b=t_b)
    bub = PL.bubble_time("interleaved", p, m, t_f, t_b, 0.0, v)
    assert r.makespan == pytest.approx(m * (t_f + t_b) + bub)
    for s in range(p):
        assert r.busy[s] == pytest.approx(m * (t_f + t_b))
        assert r.idle[s] == pytest.approx(bub)
    if t_b == t_f:
        # (p−1)/(v·m + p − 1) holds with t_b = t_f (the docstring's defaults put t_b = t_w = t_f)
        assert r.bubble_fraction[0] == pytest.approx((p - 1) / (v * m + p - 1))
    check_dependencies(r, 0.0)


def test_interleaved_needs_m_multiple_of_p():
    with pytest.raises(ValueError):
        simulate("interleaved", 4, 6, 2, t_f=1.0, t_b=1.0)


def test_zero_bubble_hand_schedule_p2_m4():
    # t_f = t_b = t_w = 1, p = 2, m = 4, by hand:
    #   stage 0: F0[0,1] F1[1,2] --- B0[3,4] F2[4,5] B1[5,6] F3[6,7] B2[7,8] W0[8,9] B3[9,10] W1 W2 W3 [10,13]
    #   stage 1: --- F0[1,2] B0[2,3] F1[3,4] B1[4,5] F2[5,6] B2[6,7] F3[7,8] B3[8,9] W0 W1 W2 W3 [9,13]
    # stage 0 waits [2,3] for B0 (two micro-batches in flight, the 1F1B limit), stage 1 waits [0,1] for F0:
    # makespan 13 = 3m + (p−1)(t_f + t_b − t_w), 1F1B's would be (m + p − 1)·3 = 15.
    r = simulate("zero-bubble", 2, 4, t_f=1.0, t_b=1.0, t_w=1.0)
    want0 = "F0 F1 B0 F2 B1 F3 B2 W0 B3 W1 W2 W3".split()
    want1 = "F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3".split()
    assert [f"{k}{i}" for k, _, _, i in r.order[0]] == want0
    assert [f"{k}{i}" for k, _, _, i in r.order[1]] == want1
    assert r.start[("B", 0, 0, 0)] == 3.0 and r.start[("W", 0, 0, 0)] == 8.0
    assert r.start[("F", 1, 0, 0)] == 1.0 and r.start[("W", 1, 0, 0)] == 9.0
    assert r.makespan == 13.0
    assert r.idle == [1.0, 1.0]
    check_dependencies(r, 0.0)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_zero_bubble_closed_form(p, m):
    # ZB-H1: bubble (p−1)(t_f + t_b − t_w) (Qi et al. 2024, Table 2), a third of 1F1B's (p−1)(t_f + t_b + t_w)
    # when the three are equal. p = 4, m = 4 by hand (t = 1 each):
    #   stage 0: F0 F1 F2 F3 [0,4], waits [4,7] for B0 (back from stage 3 at 4 + 3), then B0 W0 B1 W1 B2 W2 B3 W3
    #            back to back [7,15];
    #   stage 3: waits [0,3] for F0, then F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3 back to back [3,15];
    # makespan 3·4 + 3 = 15 against 1F1B's (4 + 3)·3 = 21.
    r = simulate("zero-bubble", p, m, t_f=1.0, t_b=1.0, t_w=1.0)
    if (p, m) == (4, 4):
        assert " ".join(f"{k}{i}" for k, _, _, i in r.order[0]) == "F0 F1 F2 F3 B0 W0 B1 W1 B2 W2 B3 W3"
        assert " ".join(f"{k}{i}" for k, _, _, i in r.order[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3"
        assert r.start[("B", 0, 0, 0)] == 7.0 and r.start[("F", 3, 0, 0)] == 3.0
    assert r.makespan == pytest.approx(3 * m + p - 1)
    for s in range(p):
        assert r.busy[s] == pytest.approx(3 * m)
        assert r.idle[s] == pytest.approx(PL.bubble_time("zero-bubble", p, m, 1.0, 1.0, 1.0))
        assert r.bubble_fraction[s] == pytest.approx(PL.bubble_fraction("zero-bubble", p, m))
    one = simulate("1f1b", p, m, t_f=1.0, t_b=1.0, t_w=1.0)
    assert r.idle[0] == pytest.approx(one.idle[0] / 3)
    check_dependencies(r, 0.0)


def test_zero_bubble_memory_limit():
    # at most p − s micro-batches between their F and B on stage s (1F1B's activation memory)
    p, m = 4, 8
    r = simulate("zero-bubble", p, m, t_f=1.0, t_b=1.5, t_w=0.5)
    for s in range(p):
        live = peak = 0
        for k, *_ in r.order[s]:
            live += (k == "F") - (k == "B")
            peak = max(peak, live)
        assert peak <= p - s


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero-bubble", 1)])
@pytest.mark.parametrize("t_p2p", [0.0, 0.3])
def test_busy_and_dependencies_with_p2p(schedule, v, t_p2p):
    p, m, t_f, t_b, t_w = 4, 8, 1.0, 1.7, 0.6
    r = simulate(schedule, p, m, v, t_f=t_f, t_b=t_b, t_w=t_w, t_p2p=t_p2p)
    for s in range(p):
        assert r.busy[s] == pytest.approx(m * (t_f + t_b + t_w))
        assert r.idle[s] == pytest.approx(r.makespan - r.busy[s])
    check_dependencies(r, t_p2p)
    if t_p2p > 0:
        base = simulate(schedule, p, m, v, t_f=t_f, t_b=t_b, t_w=t_w)
        assert r.makespan > base.makespan


def test_1f1b_with_p2p_matches_pipeline_simulate():
    # pipeline.simulate (today's list scheduler of GPipe / 1F1B) and this one agree task by task
    for sched in ("gpipe", "1f1b"):
        _, start, end = PL.simulate(sched, 4, 8, 1.0, 2.0, 0.25)
        r = simulate(sched, 4, 8, t_f=1.0, t_b=2.0, t_p2p=0.25)
        for (k, s, i), st in start.items():
            assert r.start[(k, s, 0, i)] == pytest.approx(st)
            assert r.end[(k, s, 0, i)] == pytest.approx(end[(k, s, i)])


def test_errors():
    with pytest.raises(ValueError):
        simulate("dualpipe", 4, 8, t_f=1.0, t_b=1.0)
    with pytest.raises(ValueError):
        simulate("zero-bubble", 4, 8, t_f=1.0, t_b=1.0)
    with pytest.raises(ValueError):
        simulate("1f1b", 0, 8, t_f=1.0, t_b=1.0)
    r = simulate("1f1b", 1, 3, t_f=1.0, t_b=2.0)
    assert r.makespan == 9.0 and r.idle == [0.0]


def test_zero_bubble_few_microbatches_exceeds_closed_form():
    # with m < p the warm-up never reaches a steady state and Table 2's (p−1)(t_f + t_b − t_w) is not reached:
    # p = 8, m = 4 simulates to 23 against the closed form's 3·4 + 7 = 19 (still below 1F1B's (4 + 7)·3 = 33)
    r = simulate("zero-bubble", 8, 4, t_f=1.0, t_b=1.0, t_w=1.0)
    assert r.makespan == pytest.approx(23.0)
    assert 3 * 4 + 7 < r.makespan < (4 + 7) * 3
    check_dependencies(r, 0.0)


def _cases():
    for schedule in ("gpipe", "1f1b", "interleaved", "zero-bubble"):
        for p, m in itertools.product((1, 2, 3, 4, 8), (1, 2, 4, 8, 16)):
            for v in ((1, 2, 3) if schedule == "interleaved" else (1,)):
                if schedule == "interleaved" and m % p:
                    continue
                yield schedule, p, m, v


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zero-bubble"])
def test_small_p2p_latency_moves_every_stage_little(schedule):
    # the step is continuous in t_p2p: a latency of t moves the makespan and every stage's idle time by at most
    # the hops of one chain through the pipeline (a micro-batch down and up the p·v virtual stages, and one hop
    # per micro-batch handed on in the steady state) times t, and never down; a greedy order that flips on a
    # tie (ZB-H1 running a W because its B arrives t after the stage frees up) jumps by a whole task instead
    for sched, p, m, v in _cases():
        if sched != schedule:
            continue
        for t_f, t_b, t_w in ((1000.0, 1000.0, 1000.0), (1000.0, 2000.0, 700.0), (700.0, 1300.0, 1900.0)):
            base = simulate(schedule, p, m, v, t_f=t_f, t_b=t_b, t_w=t_w)
            prev = base
            for t in (0.25, 1.0, 3.0):
                r = simulate(schedule, p, m, v, t_f=t_f, t_b=t_b, t_w=t_w, t_p2p=t)
                hops = 2 * (p * v + m)
                assert base.makespan - 1e-9 <= r.makespan <= base.makespan + hops * t + 1e-9, (sched, p, m, v, t)
                assert prev.makespan - 1e-9 <= r.makespan
                for s in range(p):
                    assert abs(r.idle[s] - base.idle[s]) <= hops * t + 1e-9, (sched, p, m, v, t, s)
                prev = r


def test_zero_bubble_with_a_tiny_p2p_latency_keeps_its_schedule():
    # p = 8, m = 16: one unit of latency used to flip stage 0 onto a W ahead of its B (idle 7000 -> 12014)
    a = simulate("zero-bubble", 8, 16, 1, t_f=1000, t_b=1000, t_w=1000)
    b = simulate("zero-bubble", 8, 16, 1, t_f=1000, t_b=1000, t_w=1000, t_p2p=1)
    assert a.idle[0] == pytest.approx(7000)
    assert a.order == b.order
    assert 7000 < b.idle[0] <= 7000 + 2 * (8 + 16)
    check_dependencies(b, 1)
