"""Charge every nanosecond of every rank's step windows to exactly one of the nine ledgers.

Precedence (LEDGERS contract): compute/recompute > communication (straggler | bubble | exposed_comm) >
memcpy > the idle gap's cause (io > bubble > host > idle). The sweep is vectorised with numpy: the window
is cut at every interval boundary into elementary segments, each labelled by array lookups.
"""
from __future__ import annotations

import numpy as np

from analysis.classify import classify_kernel
from analysis.intervals import covered, union
from analysis.ledgers import LEDGER_ID, LEDGERS

DDL = {
    # drill-down keys: the GPU op that the interval is charged to (for an idle/host/io/bubble gap, the op
    # that ends the gap), and for communication the collective's process group and sequence number
    "ledger_intervals": """job VARCHAR, rank INTEGER, step INTEGER, ledger VARCHAR, start_ns BIGINT, end_ns BIGINT,
                           op_name VARCHAR, pg_name VARCHAR, seq BIGINT""",
    "ledger_totals": """job VARCHAR, rank INTEGER, step INTEGER, ledger VARCHAR, ns BIGINT""",
    "step_windows": """job VARCHAR, rank INTEGER, step INTEGER, start_ns BIGINT, end_ns BIGINT""",
    "clock_offsets": """job VARCHAR, rank INTEGER, offset_ns BIGINT, residual_ns BIGINT, n_matched INTEGER""",
}

RECOMPUTE_HOST = ("name IN ('CheckpointFunctionBackward', 'CheckpointFunction') OR name LIKE '%recompute_fn%' "
                  "OR name LIKE '%CheckpointFunctionBackward%'")
IO_HOST = ("name LIKE 'enumerate(DataLoader)%' OR name LIKE '%DataLoader%__next__%' OR name IN "
           "('torch.load', 'torch.save', 'aten::save', 'aten::load') OR name LIKE '%checkpoint_save%' "
           "OR name LIKE '%save_checkpoint%'")
# autograd nodes; inside a reentrant checkpoint node, a nested one is the layer's real backward, not recompute
NESTED_BACKWARD = ("name LIKE 'autograd::engine::evaluate_function:%' "
                   "AND name NOT LIKE '%CheckpointFunctionBackward%'")
P2P_COLLS = ("send", "recv", "sendrecv", "batch_isend_irecv")


def _ensure_tables(con):
    for t, cols in DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")
    for col, typ in (("op_name", "VARCHAR"), ("pg_name", "VARCHAR"), ("seq", "BIGINT")):
        con.execute(f"ALTER TABLE ledger_intervals ADD COLUMN IF NOT EXISTS {col} {typ}")


def _cover_index(fs, fe):
    """For ops sorted by start (fs, fe): (running max end, index of the op holding it)."""
    if fs.size == 0:
        return fe, np.zeros(0, dtype=np.int64)
    runmax = np.maximum.accumulate(fe)
    holder = np.maximum.accumulate(np.where(fe >= runmax, np.arange(fe.size), 0))
    return runmax, holder


def _covering(x, fs, runmax, holder):
    """Index of an op of (fs sorted) that covers each point x, else -1."""
    out = np.full(x.size, -1, dtype=np.int64)
    if fs.size == 0:
        return out
    i = np.searchsorted(fs, x, side="right") - 1
    ok = i >= 0
    ic = np.maximum(i, 0)
    ok &= runmax[ic] > x
    out[ok] = holder[ic[ok]]
    return out


def _align(con, job):
    """Per-rank clock offsets from matched collective completions, and per-collective arrival info.

    A collective ends at nearly the same instant on every member, so offset_r = median over matched
    collectives of (end_r − median end of that collective). Residual = median |deviation| after removal.
    """
    rows = con.execute("""
        SELECT rank, pg_name, seq, lower(coll), start_ns, end_ns, group_size
        FROM collectives WHERE job = ? AND source = 'kernel' AND seq IS NOT NULL AND pg_name IS NOT NULL""",
                       [job]).fetchall()
    ranks = [r[0] for r in con.execute("SELECT rank FROM traces WHERE job = ? ORDER BY rank", [job]).fetchall()]
    offsets = {r: 0 for r in ranks}
    groups: dict = {}
    for rank, pg, seq, coll, s, e, gsz in rows:
        groups.setdefault((pg, seq, coll in P2P_COLLS), []).append((rank, s, e, gsz or 0, coll))
    matched = {k: v for k, v in groups.items() if len({m[0] for m in v}) >= 2}
    if matched:
        dev: dict = {r: [] for r in ranks}
        for _ in range(2):  # refine once with the offsets found
            dev = {r: [] for r in ranks}
            for members in matched.values():
                ends = np.array([e - offsets[r] for r, s, e, g, c in members])
                med = np.median(ends)
                for (r, s, e, g, c), a in zip(members, ends):
                    dev[r].append(a - med)
            for r in ranks:
                if dev[r]:
                    offsets[r] += int(np.median(dev[r]))
            ref = offsets[ranks[0]]
            offsets = {r: o - ref for r, o in offsets.items()}
    con.execute("DELETE FROM clock_offsets WHERE job = ?", [job])
    for r in ranks:
        resid = 0
        n = 0
        if matched:
            d = []
            for members in matched.values():
                ends = np.array([e - offsets[m[0]] for m in members for e in [m[2]]])
                med = np.median(ends)
                d.extend(abs(a - med) for m, a in zip(members, ends) if m[0] == r)
            n = len(d)
            resid = int(np.median(d)) if d else 0
        con.execute("INSERT INTO clock_offsets VALUES (?, ?, ?, ?, ?)", [job, r, offsets[r], resid, n])
    # wait intervals per rank: [own start, last arrival) in the rank's own clock
    waits = {r: {"straggler": ([], []), "bubble": ([], [])} for r in ranks}
    matched_keys = set()
    for key, members in groups.items():
        p2p = key[2]
        present = {m[0] for m in members}
        need = 2 if p2p else max(m[3] for m in members)
        if len(present) < max(need, 2):
            continue
        last = max(s - offsets[r] for r, s, e, g, c in members)
        for r, s, e, g, c in members:
            w_end = min(e, last + offsets[r])
            if w_end > s:
                kind = "bubble" if p2p else "straggler"
                waits[r][kind][0].append(s)
                waits[r][kind][1].append(w_end)
            matched_keys.add((r, s))
    return offsets, waits, matched_keys


def attribute_job(con, job: str) -> dict:
    _ensure_tables(con)
    for t in DDL:
        if t != "clock_offsets":
            con.execute(f"DELETE FROM {t} WHERE job = ?", [job])
    con.execute("DELETE FROM diagnostics WHERE job = ? AND source = 'attribution'", [job])
    offsets, waits, matched_keys = _align(con, job)
    ranks = [r[0] for r in con.execute("SELECT rank FROM traces WHERE job = ? ORDER BY rank", [job]).fetchall()]
    world = con.execute("SELECT max(world_size) FROM traces WHERE job = ?", [job]).fetchone()[0] or 1
    out_intervals = []
    out_totals = []
    unmatched_total = 0
    # kernel-name rules applied once per distinct name: family code 0 compute, 1 comm (2 = copy, by kind)
    import pyarrow as pa

    knames = [r[0] for r in con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = ? "
                                        "AND name IS NOT NULL ORDER BY name", [job]).fetchall()]
    rules = [classify_kernel(n) for n in knames]
    con.register("_kclass", pa.table({"kid": pa.array(range(len(knames)), pa.int32()),
                                      "name": pa.array(knames, pa.string()),
                                      "fam": pa.array([1 if r[0] == "comm" else 0 for r in rules], pa.int8()),
                                      "p2p": pa.array([r[1] == "sendrecv" for r in rules], pa.bool_())}))
    pg_names = [r[0] for r in con.execute("SELECT DISTINCT pg_name FROM collectives WHERE job = ? "
                                          "AND pg_name IS NOT NULL ORDER BY 1", [job]).fetchall()]
    con.register("_pgs", pa.table({"pgid": pa.array(range(len(pg_names)), pa.int32()),
                                   "pg_name": pa.array(pg_names, pa.string())}))
    allops = con.execute("""
        WITH launch AS (
            SELECT rank, correlation, min(start_ns) AS launch_ns FROM host_ops
            WHERE job = ? AND cat IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
            GROUP BY rank, correlation
        )
        , ck AS (  -- one collective key per comm kernel (rank, start, kernel name)
            SELECT rank, start_ns, kernel_name, any_value(pg_name) AS pg_name, any_value(seq) AS seq
            FROM collectives WHERE job = ? AND source = 'kernel' GROUP BY ALL
        )
        SELECT g.rank, CASE WHEN g.kind = 'kernel' THEN coalesce(c.fam, 0) ELSE 2 END AS fam,
               coalesce(c.p2p, false) AND g.kind = 'kernel' AS p2p,
               g.start_ns, g.end_ns, coalesce(l.launch_ns, g.start_ns) AS launch_ns,
               coalesce(c.kid, -1) AS kid, coalesce(p.pgid, -1) AS pgid, coalesce(ck.seq, -1) AS seq
        FROM gpu_ops g LEFT JOIN launch l ON l.correlation = g.correlation AND l.rank = g.rank
        LEFT JOIN _kclass c ON c.name = g.name
        LEFT JOIN ck ON ck.rank = g.rank AND ck.start_ns = g.start_ns AND ck.kernel_name = g.name
        LEFT JOIN _pgs p ON p.pg_name = ck.pg_name
        WHERE g.job = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
        ORDER BY g.rank, g.start_ns""", [job, job, job]).fetchnumpy()
    op_rank = np.asarray(allops["rank"], dtype=np.int64)
    hosts = {}
    for key, where in (("rc", RECOMPUTE_HOST), ("io", IO_HOST), ("nb", NESTED_BACKWARD)):
        h = con.execute(f"SELECT rank, start_ns, end_ns FROM host_ops WHERE job = ? AND ({where}) ORDER BY rank",
                        [job]).fetchnumpy()
        hosts[key] = (np.asarray(h["rank"], dtype=np.int64), np.asarray(h["start_ns"], dtype=np.int64),
                      np.asarray(h["end_ns"], dtype=np.int64))
    all_steps = con.execute("SELECT rank, step, start_ns, end_ns FROM steps WHERE job = ? ORDER BY rank, step",
                            [job]).fetchall()
    out_windows = []
    for rank in ranks:
        lo, hi = np.searchsorted(op_rank, [rank, rank + 1])
        ops = {k: v[lo:hi] for k, v in allops.items()}
        if len(ops["start_ns"]) == 0:
            continue
        fam = np.asarray(ops["fam"], dtype=np.int8)
        p2p = np.asarray(ops["p2p"], dtype=bool)
        s = np.asarray(ops["start_ns"], dtype=np.int64)
        e = np.asarray(ops["end_ns"], dtype=np.int64)
        launch = np.asarray(ops["launch_ns"], dtype=np.int64)
        kid = np.asarray(ops["kid"], dtype=np.int32)
        pgid = np.asarray(ops["pgid"], dtype=np.int32)
        oseq = np.asarray(ops["seq"], dtype=np.int64)

        def host_union(key):
            hr, hs, he = hosts[key]
            m = hr == rank
            return union(hs[m], he[m])

        rc_s, rc_e = host_union("rc")
        io_s, io_e = host_union("io")
        nr, ns_, ne_ = hosts["nb"]
        nm = (nr == rank)
        nb_s, nb_e = ns_[nm], ne_[nm]
        inner = covered(nb_s, rc_s, rc_e)  # nested backward nodes that start inside a checkpoint region
        nb_s, nb_e = union(nb_s[inner], nb_e[inner])
        is_re = (fam == 0) & covered(launch, rc_s, rc_e) & ~covered(launch, nb_s, nb_e)
        comp = fam == 0
        comm = fam == 1
        copy = fam == 2
        mk = np.array(sorted(k[1] for k in matched_keys if k[0] == rank), dtype=np.int64)
        comm_unmatched = int((~np.isin(s[comm], mk)).sum())
        unmatched_total += comm_unmatched

        steps = [x[1:] for x in all_steps if x[0] == rank]
        if steps:
            st_s = np.array([x[1] for x in steps], dtype=np.int64)
            step_of = np.searchsorted(st_s, launch, side="right") - 1
            st_e = np.array([x[2] for x in steps], dtype=np.int64)
            inside = (step_of >= 0) & (launch < st_e[np.maximum(step_of, 0)])
            step_of = np.where(inside, step_of, -1)
            ok = step_of >= 0
            n_st = len(steps)
            first = np.full(n_st, np.iinfo(np.int64).max, dtype=np.int64)
            last = np.full(n_st, np.iinfo(np.int64).min, dtype=np.int64)
            np.minimum.at(first, step_of[ok], s[ok])
            np.maximum.at(last, step_of[ok], e[ok])
            present = np.flatnonzero(last > np.iinfo(np.int64).min)
            windows = []
            for idx_i, si in enumerate(present):
                w0 = int(first[si])
                w1 = int(first[present[idx_i + 1]]) if idx_i + 1 < len(present) else int(last[si])
                windows.append((steps[si][0], w0, w1))
        else:
            windows = [(-1, int(s.min()), int(e.max()))]

        Cn = union(s[comp & ~is_re], e[comp & ~is_re])
        Cr = union(s[is_re], e[is_re])
        K = union(s[comm], e[comm])
        P = union(s[copy], e[copy])
        Ws = union(*waits.get(rank, {}).get("straggler", ([], [])))
        Wb = union(*waits.get(rank, {}).get("bubble", ([], [])))
        busy = union(s, e)
        order = np.argsort(s, kind="stable")
        s_sorted = s[order]
        is_p2p_next = p2p[order]
        launch_sorted = launch[order]
        # per family, ops sorted by start, to find the op each segment is charged to
        fam_ix = {}
        for fcode, fmask in ((0, comp & ~is_re), (3, is_re), (1, comm), (2, copy)):
            idx = np.flatnonzero(fmask)
            idx = idx[np.argsort(s[idx], kind="stable")]
            rm, hold = _cover_index(s[idx], e[idx])
            fam_ix[fcode] = (idx, s[idx], rm, hold)

        for step, w0, w1 in windows:
            if w1 <= w0:
                continue
            # only the intervals that touch this window (plus one before it, whose end may open a gap)
            def win(u, w0=w0, w1=w1):
                i0 = max(int(np.searchsorted(u[1], w0, side="right")) - 1, 0)
                i1 = int(np.searchsorted(u[0], w1, side="right"))
                return u[0][i0:i1], u[1][i0:i1]

            wCn, wCr, wK, wP, wWs, wWb, wIO, wB = (win(u) for u in (Cn, Cr, K, P, Ws, Wb, (io_s, io_e), busy))
            # gaps of the window: complement of GPU busy time; each gap's next op gives its launch time
            bs, be = wB
            cut = [np.array([w0, w1], dtype=np.int64)]
            for us, ue in (wCn, wCr, wK, wP, wWs, wWb, wIO, wB):
                cut.append(np.minimum(np.maximum(us, w0), w1))
                cut.append(np.minimum(np.maximum(ue, w0), w1))
            # gap ends: the start of each busy interval; next op index at that instant
            nxt = np.searchsorted(s_sorted, be, side="left")  # first op starting at/after a busy end
            valid = nxt < s_sorted.size
            gap_start = be[valid]
            gap_launch = launch_sorted[nxt[valid]]
            gap_p2p = is_p2p_next[nxt[valid]]
            gap_end = s_sorted[nxt[valid]]
            # a gap is bubble only when the p2p op that ends it waited for a peer that was matched
            gap_p2p = gap_p2p & covered(gap_end, *wWb)
            pts = np.sort(np.concatenate(cut))
            pts = pts[np.concatenate(([True], pts[1:] != pts[:-1]))]
            seg_s, seg_e = pts[:-1], pts[1:]
            lab = np.full(seg_s.size, LEDGER_ID["idle"], dtype=np.int8)
            inCn = covered(seg_s, *wCn)
            inCr = covered(seg_s, *wCr) & ~inCn
            inK = covered(seg_s, *wK) & ~inCn & ~inCr
            inP = covered(seg_s, *wP) & ~inCn & ~inCr & ~inK
            gap = ~(inCn | inCr | inK | inP)
            lab[inCn] = LEDGER_ID["compute"]
            lab[inCr] = LEDGER_ID["recompute"]
            lab[inK] = LEDGER_ID["exposed_comm"]
            lab[inK & covered(seg_s, *wWs)] = LEDGER_ID["straggler"]
            lab[inK & covered(seg_s, *wWb)] = LEDGER_ID["bubble"]
            lab[inP] = LEDGER_ID["memcpy"]
            # idle gaps: which gap (by the busy interval that ends before it) holds each segment
            gi = np.searchsorted(gap_start, seg_s, side="right") - 1
            has = gap & (gi >= 0)
            gi_c = np.maximum(gi, 0)
            if gap_start.size:
                in_gap = has & (seg_s < gap_end[gi_c])
                # the work that ends the gap was launched after the gap began: the host was late (whole gap)
                host = in_gap & (gap_launch[gi_c] > gap_start[gi_c])
                lab[in_gap & host] = LEDGER_ID["host"]
                lab[in_gap & gap_p2p[gi_c]] = LEDGER_ID["bubble"]
            lab[gap & covered(seg_s, *wIO)] = LEDGER_ID["io"]
            # drill-down key: the op each segment is charged to (gaps: the op that ends the gap)
            op = np.full(seg_s.size, -1, dtype=np.int64)
            for fcode, fsel in ((0, inCn), (3, inCr), (1, inK), (2, inP)):
                idx, fs, rm, hold = fam_ix[fcode]
                if fsel.any():
                    c = _covering(seg_s[fsel], fs, rm, hold)
                    op[np.flatnonzero(fsel)] = np.where(c >= 0, idx[np.maximum(c, 0)], -1)
            if gap.any():
                nx = np.searchsorted(s_sorted, seg_e[gap], side="left")
                op[np.flatnonzero(gap)] = np.where(nx < s_sorted.size, order[np.minimum(nx, s_sorted.size - 1)], -1)
            dur = seg_e - seg_s
            # np.clip is avoided in this loop: its per-call overhead exceeds the work at these sizes
            # float64 sums of integer ns are exact below 2**53 ns (104 days), far above any window
            tot = np.bincount(lab, weights=dur, minlength=len(LEDGERS)).astype(np.int64)
            assert int(tot.sum()) == w1 - w0
            for li, name in enumerate(LEDGERS):
                out_totals.append((job, rank, step, name, int(tot[li])))
            # merge adjacent segments of one ledger charged to the same op
            okey = np.where(op >= 0, kid[np.maximum(op, 0)], -1)
            change = np.flatnonzero((np.diff(lab) != 0) | (np.diff(op) != 0)) + 1
            starts = np.concatenate([[0], change])
            ends = np.concatenate([change, [lab.size]])
            o = op[starts]
            oc = np.maximum(o, 0)
            out_intervals.append((rank, step, lab[starts], seg_s[starts], seg_e[ends - 1],
                                  okey[starts], np.where(o >= 0, pgid[oc], -1), np.where(o >= 0, oseq[oc], -1)))
            out_windows.append((job, rank, step, w0, w1))
    if out_windows:

        cols = list(zip(*out_windows))
        con.register("_sw", pa.table({"job": cols[0], "rank": cols[1], "step": cols[2],
                                      "start_ns": pa.array(cols[3], pa.int64()), "end_ns": pa.array(cols[4], pa.int64())}))
        con.execute("INSERT INTO step_windows SELECT * FROM _sw")
        con.unregister("_sw")
    n_intervals = sum(len(x[2]) for x in out_intervals)
    if out_intervals:
        lab = np.concatenate([x[2] for x in out_intervals])

        def named(codes, names):
            # -1 = no name; dictionary-encoded, so no join and no per-row string is built here
            codes = np.asarray(codes, dtype=np.int32)
            return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(names, pa.string()))

        seq = np.concatenate([x[7] for x in out_intervals]).astype(np.int64)
        tbl = pa.table({
            "rank": np.concatenate([np.full(len(x[2]), x[0], np.int32) for x in out_intervals]),
            "step": np.concatenate([np.full(len(x[2]), x[1], np.int32) for x in out_intervals]),
            "ledger": named(lab, list(LEDGERS)),
            "start_ns": np.concatenate([x[3] for x in out_intervals]),
            "end_ns": np.concatenate([x[4] for x in out_intervals]),
            "op_name": named(np.concatenate([x[5] for x in out_intervals]), knames),
            "pg_name": named(np.concatenate([x[6] for x in out_intervals]), pg_names),
            "seq": pa.array(seq, mask=seq < 0),
        })
        con.register("_li", tbl)
        # produced rank by rank, window by window, in time order: already sorted for range scans
        con.execute("""INSERT INTO ledger_intervals (job, rank, step, ledger, start_ns, end_ns, op_name, pg_name, seq)
            SELECT ?, * FROM _li""", [job])
        con.unregister("_li")
        cols = list(zip(*out_totals))
        tbl = pa.table({"job": cols[0], "rank": cols[1], "step": cols[2], "ledger": cols[3],
                        "ns": pa.array(cols[4], pa.int64())})
        con.register("_lt", tbl)
        con.execute("INSERT INTO ledger_totals SELECT * FROM _lt")
        con.unregister("_lt")
    con.unregister("_kclass")
    con.unregister("_pgs")
    if unmatched_total:
        con.execute("INSERT INTO diagnostics VALUES (?, NULL, 'attribution', 'unmatched_comm', ?, ?)",
                    [job, unmatched_total, f"comm kernels with no peer trace (world {world}); charged to exposed_comm"])
    return {"intervals": n_intervals, "totals": len(out_totals), "offsets": offsets}
