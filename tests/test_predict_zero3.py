"""ZeRO-3 / FSDP predicted layer by layer: every layer's parameters gathered before its forward and again before
its backward, its gradient reduce-scattered after its backward, in every micro-batch, the gathers prefetched
ahead of the layer computing. The layer recurrence against schedules worked by hand; predict's timeline against
the recurrence; ZeRO-1 keeps one gradient sync per step."""
import pytest

from ninefold.analysis.cost_model.config import ConfigError, load_config
from ninefold.analysis.cost_model.predict import predict
from ninefold.analysis.cost_model.timeline import zero3_layers


def test_forward_gathers_hidden_behind_the_layer_before():
    # n = 3 layers of 10, gathers of 8, prefetch 1: AG0 [0,8], C0 [8,18], AG1 [8,16], C1 [18,28], AG2 [18,26],
    # C2 [28,38]: only the first gather is exposed
    starts, ag, rs, end = zero3_layers(3, 10, 8, 0, 1, backward=False)
    assert starts == [8, 18, 28] and ag == [(0, 8), (8, 16), (18, 26)] and rs == [] and end == 38
    # prefetch 2: AG0 [0,8], AG1 [8,16] both issued at once; AG2 issued when C0 starts (8), queued to [16,24]
    starts, ag, _, end = zero3_layers(3, 10, 8, 0, 2, backward=False)
    assert starts == [8, 18, 28] and ag == [(0, 8), (8, 16), (16, 24)] and end == 38


def test_forward_bound_by_the_gathers():
    # gathers of 12 outlast layers of 10: each layer waits for its gather, end = n·g + cl
    starts, ag, _, end = zero3_layers(3, 10, 12, 0, 1, backward=False)
    assert starts == [12, 24, 36] and ag == [(0, 12), (12, 24), (24, 36)] and end == 3 * 12 + 10
    assert zero3_layers(3, 10, 12, 0, 2, backward=False)[3] == 46
    # no communication: the layers back to back
    assert zero3_layers(5, 10, 0, 0, 1, backward=False)[3] == 50


def test_backward_gathers_and_reduce_scatters_share_one_stream():
    # n = 3, cl = 10, g = 8, r = 6, prefetch 1: AG0 [0,8]; C0 [8,18]; AG1 [8,16]; RS0 [18,24]; C1 [18,28];
    # AG2 issued at 18 behind RS0: [24,32]; RS1 [32,38]; C2 waits for AG2: [32,42]; RS2 [42,48]
    starts, ag, rs, end = zero3_layers(3, 10, 8, 6, 1, backward=True)
    assert starts == [8, 18, 32]
    assert ag == [(0, 8), (8, 16), (24, 32)] and rs == [(18, 24), (32, 38), (42, 48)] and end == 48
    # g + r <= cl: only the first gather and the last reduce-scatter are exposed
    assert zero3_layers(6, 20, 8, 6, 1, backward=True)[3] == 8 + 6 * 20 + 6


CFG = """
[model]
parameters = 1.3e9
layers = 24
hidden = 2048
heads = 16
ffn_hidden = 8192
seq_len = 2048
vocab = 50304
mlp = "gelu"
[parallel]
dp = 8
micro_batches = {m}
micro_batch_size = {mbs}
zero_stage = {zs}
fsdp_prefetch = {k}
[hardware]
preset = "H100"
[compute]
mfu = 0.4
"""


def _pred(tmp_path, zs=3, m=2, mbs=1, k=1):
    f = tmp_path / f"z{zs}_{m}_{mbs}_{k}.toml"
    f.write_text(CFG.format(zs=zs, m=m, mbs=mbs, k=k))
    return predict(load_config(f), keep_events=True)


@pytest.mark.parametrize("mbs", [1, 8])
def test_predict_charges_the_layer_recurrence_per_micro_batch(tmp_path, mbs):
    pred = _pred(tmp_path, m=2, mbs=mbs)
    plan = pred.plan
    n = plan.z3_layers
    assert n == 24 and plan.grad_sync == 0 and plan.param_gather == 0 and plan.z3_gather > 0
    cf, cb = max(plan.fwd), max(plan.bwd) + max(plan.rec)
    def layers(c):  # the block's compute in n layers, the remainder on the last
        return [c // n] * (n - 1) + [c - c // n * (n - 1)]

    ef = zero3_layers(n, layers(cf), plan.z3_gather, 0, 1, False)[3] - cf
    eb = zero3_layers(n, layers(cb), plan.z3_gather, plan.z3_reduce, 1, True)[3] - cb
    for r, led in pred.ledgers.items():
        assert led["exposed_comm"] == plan.m * (ef + eb)
        assert led["compute"] + led["recompute"] == plan.m * (cf + cb) + plan.optimizer
    evs = pred.events[0]
    assert sum(e.coll == "all_gather" for e in evs) == 2 * n * plan.m          # forward and backward, per micro-batch
    assert sum(e.coll == "reduce_scatter" for e in evs) == n * plan.m
    assert all(e.pg for e in evs if e.coll in ("all_gather", "reduce_scatter"))
    # a bigger micro-batch computes longer per layer and hides more of the same gathers
    if mbs == 8:
        small = _pred(tmp_path, m=2, mbs=1)
        share = lambda p: p.mean()["exposed_comm"] / p.step_ns
        assert share(pred) < share(small)


def test_more_micro_batches_gather_more_often(tmp_path):
    two, four = _pred(tmp_path, m=2), _pred(tmp_path, m=4)
    assert four.mean()["exposed_comm"] == pytest.approx(2 * two.mean()["exposed_comm"], rel=1e-6)


def test_zero1_keeps_one_gradient_sync_per_step(tmp_path):
    pred = _pred(tmp_path, zs=1)
    assert pred.plan.z3_layers == 0 and pred.plan.grad_sync > 0 and pred.plan.param_gather > 0
    evs = pred.events[0]
    assert [e.name for e in evs if e.coll == "reduce_scatter"] == ["dp_grad_sync"]
    assert [e.name for e in evs if e.coll == "all_gather"] == ["dp_param_gather"]


def test_prefetch_must_be_positive(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(CFG.format(zs=3, m=1, mbs=1, k=0))
    with pytest.raises(ConfigError, match="fsdp_prefetch"):
        load_config(f)
