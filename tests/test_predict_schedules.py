"""DualPipe simulated (dualpipe_sim) against hand-computed schedules and the report's closed form; zero-bubble and
DualPipe wired into predict."""
import pytest

from ninefold.analysis.cost_model import pipeline as PL
from ninefold.analysis.cost_model.config import ConfigError, load_config
from ninefold.analysis.cost_model.dualpipe_sim import position, rank_of, simulate_dualpipe
from ninefold.analysis.cost_model.predict import predict
from ninefold.analysis.cost_model.schedule_sim import simulate


def names(r, rank):
    """What a rank ran, in order: F3a = forward of micro-batch 3, direction a (0); a pair / a whole backward as
    its tasks joined by &."""
    def one(t):
        return f"{t[0]}{t[3]}{'ab'[t[1]]}"

    return " ".join("&".join(one(x) for x in t) if isinstance(t[0], tuple) else one(t) for t in r.order[rank])


def check(r, t_p2p=0.0):
    """Dependencies re-derived here, one thing at a time per rank, every task once, at most p + 1 micro-batches
    between forward and backward on a rank (Table 2's activation memory)."""
    p, half = r.p, r.m // 2
    for (kind, d, k, i), st in r.start.items():
        if kind == "F" and k > 0:
            assert st >= r.end[("F", d, k - 1, i)] + t_p2p - 1e-9
        if kind == "B":
            dep = ("B", d, k + 1, i) if k < p - 1 else ("F", d, k, i)
            assert st >= r.end[dep] + (t_p2p if k < p - 1 else 0) - 1e-9
        if kind == "W":
            assert st >= r.start[("B", d, k, i)] - 1e-9
    assert set(r.start) == {(k, d, x, i) for k in "FBW" for d in (0, 1) for x in range(p) for i in range(half)}
    for rank in range(p):
        items = [t if isinstance(t[0], tuple) else (t,) for t in r.order[rank]]
        spans = sorted((r.start[t[0]], r.end[t[0]]) for t in items)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-9
        assert all(position(p, rank, x[1]) == x[2] for t in items for x in t)
        live = peak = 0
        for t in items:
            live += sum((x[0] == "F") - (x[0] == "B") for x in t)
            peak = max(peak, live)
        assert peak <= p + 1


def test_positions():
    assert [position(4, r, 0) for r in range(4)] == [0, 1, 2, 3]
    assert [position(4, r, 1) for r in range(4)] == [3, 2, 1, 0]
    assert all(rank_of(4, position(4, r, d), d) == r for r in range(4) for d in (0, 1))


def test_hand_schedule_p2_m4():
    # F = B = W = 1, no communication; direction a enters at rank 0, b at rank 1; both ranks are middle ranks.
    # Rank 0's order: F0 F1 (step 2), the middle rank's first F0 & B1 as two lone chunks, F1 & B0, then B1 B0
    # (B0 with W split off), W. By hand: F0a [0,1]; F0b [1,2] (F0b leaves rank 1 at 1); F1a [2,3]; B0b whole
    # [3,5] (rank 0 is b's last position: after its own F0b); F1b & B0a [5,8] (B0a back from rank 1 at 5);
    # B1b whole [8,10]; B1a [10,11]; W1a [11,12]. Rank 1 is the mirror. No idle: (p/2 − 1)(...) = 0.
    r = simulate_dualpipe(2, 4, c_f=1, c_b=1, c_w=1)
    assert names(r, 0) == "F0a F0b F1a B0b&W0b F1b&B0a&W0a B1b&W1b B1a W1a"
    assert names(r, 1) == "F0b F0a F1b B0a&W0a F1a&B0b&W0b B1a&W1a B1b W1b"
    assert r.start[("F", 1, 1, 1)] == 5 and r.end[("F", 1, 1, 1)] == 8
    assert r.start[("B", 0, 0, 1)] == 10 and r.start[("W", 0, 0, 1)] == 11
    assert r.makespan == 12 and r.idle == [0, 0] and r.busy == [12, 12]
    check(r)


def test_hand_schedule_p4_m8():
    # rank 0 (a at position 0, b at 3; hr = 0, not a middle rank), F = B = W = 1, by hand:
    #   step 1: F0a F1a [0,2]; step 2: F2a [2,3], F0b [3,4] (F0b leaves rank 1 at 3); step 3: B0b [4,5], W0b
    #   [5,6], F1b [6,7]; step 4: F3a & B1b [7,10], F2b & B0a [11,14] (B0a back from rank 1 at 11: idle [10,11]);
    #   step 5: B2b whole [14,16], F3b & B1a [17,20] (B1a from rank 1 at 17); step 6: B3b whole, B2a;
    #   steps 7-8: W2a, B3a, W3a. Makespan 26 of 24 work: idle 2 = (p/2 − 1)(F&B + B − 3W) = 1·(3 + 2 − 3).
    r = simulate_dualpipe(4, 8, c_f=1, c_b=1, c_w=1)
    assert names(r, 0) == ("F0a F1a F2a F0b B0b W0b F1b F3a&B1b&W1b F2b&B0a&W0a B2b&W2b F3b&B1a&W1a B3b&W3b "
                           "B2a W2a B3a W3a")
    assert [r.start[t] for t in (("F", 1, 3, 0), ("W", 1, 3, 0), ("F", 1, 3, 1), ("F", 0, 0, 3), ("F", 1, 3, 2),
                                 ("F", 1, 3, 3))] == [3, 5, 6, 7, 11, 17]
    assert r.makespan == 26 and r.idle == [2, 2, 2, 2]
    check(r)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8), (4, 12), (8, 16), (8, 20)])
def test_report_closed_form(p, m):
    # DeepSeek-V3 Table 2: bubble (p/2 − 1)(F&B + B − 3W), here F = B(input) = W = 1, F&B = 3, B = 2 → 2(p/2 − 1)
    r = simulate_dualpipe(p, m, c_f=1, c_b=1, c_w=1)
    want = PL.bubble_time("dualpipe", p, m, 1.0, 1.0, 1.0)
    assert r.idle == pytest.approx([want] * p)
    assert r.busy == pytest.approx([3 * m] * p)
    check(r)


def test_all_to_all_hidden_by_the_paired_chunk():
    # a = 1 per chunk, p = 2, m = 4: inside the pair F1b & B0a (compute 3 ≥ communication 2) it is hidden; the
    # six lone chunks of rank 0 (F0a F0b F1a B0b B1b B1a) each wait for their own: 6 exposed
    r = simulate_dualpipe(2, 4, c_f=1, c_b=1, c_w=1, a_f=1, a_b=1)
    assert names(r, 0) == "F0a F0b F1a B0b&W0b F1b&B0a&W0a B1b&W1b B1a W1a"
    assert r.exposed == [6, 6]
    pair = r.end[("F", 1, 1, 1)] - r.start[("F", 1, 1, 1)]
    assert pair == 3.0
    # one overlap factor for every chunk would expose all eight
    assert r.exposed[0] < 8 * 1
    # communication longer than the pair's compute: only the excess shows
    big = simulate_dualpipe(2, 4, c_f=1, c_b=1, c_w=1, a_f=2.5, a_b=2.5)
    assert big.end[("F", 1, 1, 1)] - big.start[("F", 1, 1, 1)] == 5.0
    check(big)
    # more micro-batches: the share hidden grows (pairs in the steady state)
    many = simulate_dualpipe(4, 16, c_f=1, c_b=1, c_w=1, a_f=1, a_b=1)
    assert many.exposed[0] / (16 * 2) < 0.5
    check(many)


@pytest.mark.parametrize("t_p2p", [0.0, 0.4])
def test_odd_durations_keep_the_invariants(t_p2p):
    r = simulate_dualpipe(8, 20, c_f=1.0, c_b=1.3, c_w=0.7, a_f=0.6, a_b=0.9, t_p2p=t_p2p)
    check(r, t_p2p)
    assert r.busy == pytest.approx([20 * 3.0] * 8)
    assert all(x >= -1e-9 for x in r.idle)


def test_errors():
    for p, m in ((3, 6), (4, 9), (4, 4)):
        with pytest.raises(ValueError):
            simulate_dualpipe(p, m, c_f=1, c_b=1, c_w=1)


CFG = """
[model]
layers = 8
hidden = 2048
heads = 16
seq_len = 2048
experts = 8
top_k = 2
[parallel]
dp = 8
ep = 8
pp = {pp}
micro_batches = {m}
schedule = "{sched}"
[hardware]
preset = "H800"
"""


def _pred(tmp_path, sched, pp=4, m=8):
    f = tmp_path / f"{sched}.toml"
    f.write_text(CFG.format(sched=sched, pp=pp, m=m))
    return predict(load_config(f))


def test_predict_zero_bubble_uses_the_simulation(tmp_path):
    pred = _pred(tmp_path, "zero-bubble")
    plan, cfg = pred.plan, pred.cfg
    w = cfg["compute.weight_grad_share"]
    d_f = max(plan.fwd) + plan.a2a_fwd
    d_b = max(plan.bwd) + max(plan.rec) + plan.a2a_bwd
    hop = plan.p2p
    sim = simulate("zero-bubble", 4, 8, t_f=d_f, t_b=d_b * (1 - w), t_w=d_b * w, t_p2p=hop)
    for r, led in pred.ledgers.items():
        stage = r // 8
        assert led["bubble"] == pytest.approx(sim.idle[stage], abs=2)
    assert "zero-bubble simulated" in pred.sources["bubble"]
    one = _pred(tmp_path, "1f1b")
    assert pred.mean()["bubble"] < one.mean()["bubble"]


def test_predict_dualpipe_hides_all_to_all(tmp_path):
    pred = _pred(tmp_path, "dualpipe")
    assert "dualpipe simulated" in pred.sources["bubble"]
    assert pred.cfg.hardware().name == "NVIDIA H800 SXM5 80GB"
    zb = _pred(tmp_path, "zero-bubble")
    # the same compute but for the optimizer over two parameter copies; the pairs hide all-to-all that the
    # other schedules expose
    assert pred.plan.optimizer == pytest.approx(2 * zb.plan.optimizer, abs=1)
    assert pred.mean()["compute"] - pred.plan.optimizer == pytest.approx(zb.mean()["compute"] - zb.plan.optimizer,
                                                                          rel=1e-6)
    dp_p, dp_z = pred.plan.grad_sync, zb.plan.grad_sync        # two parameter copies: twice the gradients
    assert pred.mean()["exposed_comm"] - dp_p < zb.mean()["exposed_comm"] - dp_z
    plan = pred.plan
    w = pred.cfg["compute.weight_grad_share"]
    b_all = max(plan.bwd) + max(plan.rec)
    sim = simulate_dualpipe(4, 8, c_f=max(plan.fwd), c_b=b_all * (1 - w), c_w=b_all * w, a_f=plan.a2a_fwd,
                            a_b=plan.a2a_bwd, t_p2p=plan.p2p)
    assert pred.ledgers[0]["bubble"] == pytest.approx(sim.idle[0], abs=2)
    for m in (7, 6):
        with pytest.raises(ConfigError, match="even number, at least 2 \\* pp = 8"):
            _pred(tmp_path, "dualpipe", m=m)
