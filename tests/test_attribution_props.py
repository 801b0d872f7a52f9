"""LEDGERS invariants as properties: exact conservation, no overlap, order independence, clock shifts."""
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.attribution import attribute_job
from analysis.ledgers import LEDGERS
from store.connection import connect

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
