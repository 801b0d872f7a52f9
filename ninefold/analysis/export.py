"""A stored job as one Chrome-trace JSON that the Perfetto UI and chrome://tracing open, and that ninefold ingests
again: per rank its host threads and GPU streams as they were recorded, a ledger track (each charged interval named
by its ledger, the drill-down keys as args) and a critical-path track (ninefold.analysis.critical_path) with flow arrows
where the path moves to another rank. Times are on the reference clock (each rank's clock offset applied), written
as microseconds with three decimals after ``baseTimeNanoseconds``, so every nanosecond survives a re-ingest.

Processes: rank R's host is pid 10*R + 1 and its GPU pid 10*R + 2 (thread ids as recorded, a text one such as
"PyTorch Profiler" as a JSON string; GPU threads are its streams; the ledger and critical-path tracks are threads
of the GPU process). Every value is written through the JSON serializer (ninefold.analysis.chrome_trace), one event a line.
"""
from __future__ import annotations

import json
from pathlib import Path

from ninefold.analysis.chrome_trace import event as _event, meta as _meta
from ninefold.store.connection import has_table

LEDGER_TID = 1_000_001
PATH_TID = 1_000_002
GPU_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "sync": "cuda_sync"}
DRILL_KEYS = ("op_name", "pg_name", "seq", "kclass", "coll", "bytes", "group_size", "axis", "algorithm",
              "protocol", "n_channels", "copy_kind")


class ExportError(Exception):
    pass


def _tid(v):
    """A stored thread id as the trace had it: the integer of a decimal one, else the text ("PyTorch Profiler")."""
    if v is None:
        return 0
    try:
        return int(v) if str(int(v)) == v else v
    except ValueError:
        return v


def export_trace(con, job: str, steps=None, rank=None) -> str:
    """The Chrome-trace JSON text of JOB (all its steps, or STEPS; all ranks, or RANK)."""
    return "".join(iter_trace(con, job, steps=steps, rank=rank))


def iter_trace(con, job: str, steps=None, rank=None):
    """export_trace's text in pieces (the head, then a batch of event lines at a time), read from the store as it
    is written: a big job is never held whole. An ExportError (no such job, rank or step) is raised here, before
    any piece."""
    ranks, span, off, base, head = _plan(con, job, steps, rank)

    def pieces():
        yield json.dumps(head)[:-1] + ', "traceEvents": [\n'
        first = True
        for batch in _batches(ev for r in ranks for ev in _rank_events(con, job, r, int(off.get(r, 0) or 0),
                                                                        span[r], base, steps)):
            yield ("" if first else ",\n") + ",\n".join(batch)
            first = False
        for batch in _batches(_path_events(con, job, ranks, base, steps)):
            yield ("" if first else ",\n") + ",\n".join(batch)
            first = False
        yield "\n]}\n"
    return pieces()


def _batches(events, n: int = 20_000):
    batch = []
    for ev in events:
        batch.append(ev)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _plan(con, job, steps, rank):
    """(ranks, span per rank, clock offsets, base ns, head object) of an export; ExportError when the job, a rank
    or a step asked for is not there."""
    if not has_table(con, "step_windows") or not con.execute("SELECT count(*) FROM step_windows WHERE job = ?",
                                                        [job]).fetchall()[0][0]:
        raise ExportError(f"job {job!r} has no attributed step windows (run `ninefold attribute` first)")
    off = dict(con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE job = ?", [job]).fetchall())
    win = con.execute("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE job = ? ORDER BY rank, step",
                      [job]).fetchall()
    ranks = sorted({r for r, *_ in win})
    if rank is not None:
        if rank not in ranks:
            raise ExportError(f"job {job!r} has no rank {rank} (ranks {ranks[0]}..{ranks[-1]})")
        ranks = [rank]
    if steps is not None:
        have = {s for _, s, _, _ in win}
        missing = sorted(set(steps) - have)
        if missing:
            raise ExportError(f"job {job!r} has no step {', '.join(map(str, missing))}")
    span = {}
    for r, s, a, b in win:
        if r in ranks and (steps is None or s in steps):
            lo, hi = span.get(r, (a, b))
            span[r] = (min(lo, a), max(hi, b))
    if steps is None:  # every event of the rank, not only those inside its steps
        for r, a, b in con.execute("SELECT rank, min(start_ns), max(end_ns) FROM (SELECT rank, start_ns, end_ns "
                                   "FROM host_ops WHERE job = ? UNION ALL SELECT rank, start_ns, end_ns FROM "
                                   "gpu_ops WHERE job = ?) GROUP BY rank", [job, job]).fetchall():
            if r in span:
                span[r] = (min(span[r][0], a), max(span[r][1], b))
    base = min(a - int(off.get(r, 0) or 0) for r, (a, _) in span.items())
    base -= base % 1000
    tr = con.execute("SELECT rank, world_size, device_name FROM traces WHERE job = ?", [job]).fetchall()
    world = max([w or 0 for _, w, _ in tr] + [len(ranks)])
    dev = next((d for _, _, d in tr if d), None)
    head = {"schemaVersion": 1, "displayTimeUnit": "ns", "baseTimeNanoseconds": base,
            "ninefold": {"job": job, "steps": sorted(steps) if steps is not None else "all",
                         "clock": "reference (clock_offsets applied)"}}
    if rank is not None:
        head["distributedInfo"] = {"rank": rank, "world_size": world}
    if dev:
        head["deviceProperties"] = [{"id": 0, "name": dev}]
    return ranks, span, off, base, head


def _rows(con, sql, params, n: int = 50_000):
    """The rows of a query, N at a time, on a cursor of its own (in the connection's current database)."""
    db = con.execute("SELECT current_database()").fetchall()[0][0]
    cur = con.cursor()
    try:
        cur.execute(f"USE {json.dumps(db)}")
        cur.execute(sql, params)
        while rows := cur.fetchmany(n):
            yield from rows
    finally:
        cur.close()


def _rank_events(con, job, r, o, ab, base, steps):
    """Rank R's event lines: process and thread names, host ops, GPU ops and its ledger track."""
    a, b = ab
    hp, gp = 10 * r + 1, 10 * r + 2
    yield _meta(hp, 0, "process_name", f"rank {r} host", 2 * r)
    yield _meta(gp, 0, "process_name", f"rank {r} GPU", 2 * r + 1)
    yield _meta(gp, LEDGER_TID, "thread_name", "ledgers", 0)
    yield _meta(gp, PATH_TID, "thread_name", "critical path", 1)
    for cat, name, tid, s, e, x, c, args in _rows(
            con, "SELECT cat, name, tid, start_ns, end_ns, external_id, correlation, args FROM host_ops "
            "WHERE job = ? AND rank = ? AND end_ns >= ? AND start_ns <= ? ORDER BY start_ns, end_ns DESC",
            [job, r, a, b]):
        if args is None:
            kv = {}
            if x is not None:
                kv["External id"] = x
            if c is not None:
                kv["correlation"] = c
            args = json.dumps(kv)
        yield _event("X", cat, name, hp, _tid(tid), (s - o - base), (e - s), args)
    for kind, name, stream, s, e, args in _rows(
            con, "SELECT kind, name, stream, start_ns, end_ns, args FROM gpu_ops WHERE job = ? AND rank = ? "
            "AND end_ns >= ? AND start_ns <= ? ORDER BY start_ns", [job, r, a, b]):
        yield _event("X", GPU_CAT.get(kind, kind), name, gp, stream if stream is not None else 0,
                     (s - o - base), (e - s), args or "{}")
    yield from _ledger_events(con, job, r, o, base, gp, steps)


def _ledger_events(con, job, r, o, base, gp, steps):
    table = "ledger_drilldown" if has_table(con, "ledger_drilldown") else "ledger_intervals"
    cols = [c for (c,) in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                                      [table]).fetchall()]
    keys = [k for k in DRILL_KEYS if k in cols]
    q = (f"SELECT step, ledger, start_ns, end_ns{''.join(', ' + k for k in keys)} FROM {table} "
         "WHERE job = ? AND rank = ?")
    params = [job, r]
    if steps is not None:
        q += " AND list_contains(?::INTEGER[], step)"
        params.append(sorted(steps))
    for row in _rows(con, q + " ORDER BY start_ns", params):
        step, led, s, e = row[:4]
        kv = {"step": step}
        kv.update({k: v for k, v in zip(keys, row[4:]) if v is not None})
        yield _event("X", "ninefold_ledger", led, gp, LEDGER_TID, (s - o - base), (e - s),
                  json.dumps(kv, default=str))


def _path_events(con, job, ranks, base, steps):
    if not has_table(con, "critical_path"):
        return
    q = ("SELECT step, seq, rank, kind, op_name, aligned_start_ns, aligned_end_ns, ledger FROM critical_path "
         "WHERE job = ?")
    params = [job]
    if steps is not None:
        q += " AND list_contains(?::INTEGER[], step)"
        params.append(sorted(steps))
    rows = con.execute(q + " ORDER BY step, seq", params).fetchall()
    keep = set(ranks)
    flow = 0
    for i, (step, seq, r, kind, op, s, e, led) in enumerate(rows):
        if r not in keep:
            continue
        gp = 10 * r + 2
        name = f"{kind}: {op}" if op else kind
        yield _event("X", "ninefold_critical_path", name, gp, PATH_TID, (s - base), (e - s),
                  json.dumps({"step": step, "seq": seq, "ledger": led}))
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        if nxt is not None and nxt[0] == step and nxt[2] != r and nxt[2] in keep:
            flow += 1
            yield _event("s", "ninefold_critical_path", "critical path", gp, PATH_TID, (e - base - 1),
                      extra={"id": flow})
            yield _event("f", "ninefold_critical_path", "critical path", 10 * nxt[2] + 2, PATH_TID,
                      (nxt[5] - base), extra={"id": flow, "bp": "e"})


def write_trace(con, job: str, out, steps=None, rank=None) -> Path:
    """Write export_trace(...) to OUT (gzip when it ends in .gz) as it is read, atomically."""
    import gzip
    import os

    out = Path(out)
    pieces = iter_trace(con, job, steps=steps, rank=rank)  # refuses before the file is opened
    tmp = out.with_name(out.name + ".tmp")
    try:
        with (gzip.open(tmp, "wb") if out.suffix == ".gz" else open(tmp, "wb")) as f:
            for piece in pieces:
                f.write(piece.encode())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return out
