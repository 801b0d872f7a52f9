"""LEDGERS invariants as properties: exact conservation, no overlap, order independence, clock shifts."""

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.ledgers import LEDGERS
from ninefold.store.connection import connect

KERNELS = ["sm90_xmma_gemm_bf16", "flash_fwd_kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "vectorized_elementwise"]


def _ops(draw_list):
    return draw_list


op = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2_000_000), st.integers(1, 300_000),
               st.integers(0, 200_000))


def _load(con, job, rank, ops, shift=0, order=None):
    con.execute("INSERT INTO traces (job, rank, path, sha256, format, world_size) VALUES (?, ?, ?, ?, 'kineto', 2)",
                [job, rank, f"{job}-{rank}", f"{job}-{rank}"])
    idx = list(range(len(ops))) if order is None else order
    for i in idx:
        k, stream, start, dur, lag = ops[i]
        start += shift
        corr = rank * 100000 + i
        kind = "memcpy" if k == 3 and stream == 3 else "kernel"
        con.execute("INSERT INTO gpu_ops (job, rank, device, stream, kind, name, start_ns, end_ns, correlation) "
                    "VALUES (?, ?, 0, ?, ?, ?, ?, ?, ?)", [job, rank, stream, kind, KERNELS[k], start, start + dur, corr])
        con.execute("INSERT INTO host_ops (job, rank, pid, tid, cat, name, start_ns, end_ns, correlation) "
                    "VALUES (?, ?, '1', '1', 'cuda_runtime', 'cudaLaunchKernel', ?, ?, ?)",
                    [job, rank, start - lag, start - lag + 10, corr])
    con.execute("INSERT INTO host_ops (job, rank, pid, tid, cat, name, start_ns, end_ns) VALUES "
                "(?, ?, '1', '1', 'user_annotation', 'enumerate(DataLoader)#_Iter.__next__', ?, ?)",
                [job, rank, 100_000 + shift, 400_000 + shift])


def _totals(con, job):
    return con.execute("SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = ? ORDER BY ALL", [job]).fetchall()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=40), perm_seed=st.integers(0, 10**6),
       shift=st.integers(-5 * 10**9, 5 * 10**9))
# two kernels start together after a gap, one launched before it and one after: the gap's cause must not
# depend on which the file lists first (the earliest launched decides: queued work, so idle)
@example(ops=[(0, 0, 0, 1, 0), (0, 2, 2, 1, 0), (0, 0, 0, 1, 0), (0, 0, 0, 1, 0), (0, 2, 2, 1, 1)], perm_seed=0,
         shift=0)
def test_partition_invariants(tmp_path_factory, ops, perm_seed, shift):
    con = connect(tmp_path_factory.mktemp("p") / "p.duckdb")
    _load(con, "a", 0, ops)
    attribute_job(con, "a")
    tot = _totals(con, "a")
    win = con.execute("SELECT start_ns, end_ns FROM step_windows WHERE job = 'a'").fetchall()
    assert len(win) == 1
    w0, w1 = win[0]
    assert sum(r[3] for r in tot) == w1 - w0
    assert all(r[3] >= 0 for r in tot) and {r[2] for r in tot} == set(LEDGERS)
    iv = con.execute("SELECT start_ns, end_ns FROM ledger_intervals WHERE job = 'a' ORDER BY start_ns").fetchall()
    assert iv[0][0] == w0 and iv[-1][1] == w1
    assert all(a[1] == b[0] for a, b in zip(iv, iv[1:]))  # contiguous, no overlap, no hole
    # compute + recompute equals the union of compute-kernel busy time
    comp = [(s, s + d) for k, stream, s, d, lag in ops if not (k == 3 and stream == 3) and k != 2]
    busy = 0
    end = None
    for s, e in sorted(comp):
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    got = sum(r[3] for r in tot if r[2] in ("compute", "recompute"))
    assert got == busy
    # order independence and clock-shift invariance
    order = [int(i) for i in np.random.default_rng(perm_seed).permutation(len(ops))]
    _load(con, "b", 0, ops, shift=shift, order=order)
    attribute_job(con, "b")
    assert [r[1:] for r in _totals(con, "b")] == [r[1:] for r in tot]
    con.close()


def _check_independent(con, per_rank, shifts, stray):
    # no communication kernels: NCCL kernels of different ranks are matched (by order when nothing else
    # names them), and matched ranks are not independent
    per_rank = [[(1 if o[0] == 2 else o[0],) + tuple(o[1:]) for o in ops] for ops in per_rank]
    for r, ops in enumerate(per_rank):
        for job in ("all", f"one{r}"):
            _load(con, job, r, ops, shift=shifts[r])
            if stray:  # a kernel stamped near the epoch's zero beside epoch-scale ones
                con.execute("INSERT INTO gpu_ops (job, rank, device, stream, kind, name, start_ns, end_ns) "
                            "VALUES (?, ?, 0, 0, 'kernel', 'sm90_xmma_gemm_bf16', 5, 10)", [job, r])
    attribute_job(con, "all")
    q = "SELECT rank, step, ledger, start_ns, end_ns, op_name FROM ledger_intervals WHERE job = ? ORDER BY ALL"
    together = _totals(con, "all")
    alone = []
    iv_alone = []
    for r in range(len(per_rank)):
        attribute_job(con, f"one{r}")
        alone += _totals(con, f"one{r}")
        iv_alone += con.execute(q, [f"one{r}"]).fetchall()
    assert together and together == sorted(alone)
    assert con.execute(q, ["all"]).fetchall() == sorted(iv_alone)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(per_rank=st.lists(st.lists(op, min_size=1, max_size=25), min_size=2, max_size=4),
       shifts=st.lists(st.sampled_from([0, 7, 10**9, 1_700_000_000_000_000_000, 1_750_000_000_000_000_000]),
                       min_size=4, max_size=4), stray=st.booleans())
def test_ranks_without_shared_collectives_are_independent(tmp_path_factory, per_rank, shifts, stray):
    # a job's ranks are swept together on one shared axis: without collectives between them, each must come
    # out exactly as when it is attributed alone, whatever the clocks
    _check_independent(connect(tmp_path_factory.mktemp("m") / "m.duckdb"), per_rank, shifts, stray)


def test_epoch_spans_that_overflow_one_axis_are_swept_in_groups(tmp_path):
    # six ranks each spanning ~1.7e18 ns (a stray near-zero kernel): together beyond int64
    ops = [(0, 0, 0, 50_000, 1000), (2, 1, 20_000, 40_000, 500), (1, 0, 90_000, 10_000, 80_000)]
    _check_independent(connect(tmp_path / "o.duckdb"), [ops] * 6, [1_700_000_000_000_000_000] * 6, True)
