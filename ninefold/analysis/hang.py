"""Hang report from Flight Recorder dumps (fr_entries / fr_pgs / fr_dumps).

Per process group (by pg name, the cross-rank key; ``pg_id`` is a per-process uid): its members are the
ranks its ``pg_config`` lists on any rank, plus every rank whose dump has entries for it. N is the highest
``collective_seq_id`` any member enqueued on the group. A member whose own highest sequence is below N never
reached collective N: the group is hung waiting for it (formats.md §4.3: the analyzer's "Not all ranks
joining collective N ... missing ranks"). For every member the report also gives its last enqueued and last
completed collective. P2P entries (``is_p2p``) do not move ``collective_seq_id`` and are left out.
Ranks whose dumps disagree on the op at one sequence are listed as op mismatches (a desync).
"""
from __future__ import annotations


def hang_report(con, job: str) -> dict:
    per_rank = con.execute("""
        WITH e AS (
            SELECT rank, pg_name, pg_desc, seq, op, state FROM fr_entries
            WHERE job = ? AND NOT coalesce(is_p2p, false) AND seq IS NOT NULL AND seq > 0 AND pg_name IS NOT NULL
        ), members AS (
            SELECT DISTINCT pg_name, unnest(member_ranks) AS rank FROM fr_pgs
            WHERE job = ? AND member_ranks IS NOT NULL AND pg_name IS NOT NULL
            UNION SELECT DISTINCT pg_name, rank FROM e
        ), pgmax AS (
            SELECT pg_name, max(seq) AS n, any_value(pg_desc) AS pg_desc FROM e GROUP BY pg_name
        ), last AS (
            SELECT rank, pg_name, max(seq) AS last_seq, arg_max(op, seq) AS last_op, arg_max(state, seq) AS last_state
            FROM e GROUP BY rank, pg_name
        ), comp AS (
            SELECT rank, pg_name, max(seq) AS c_seq, arg_max(op, seq) AS c_op FROM e WHERE state = 'completed'
            GROUP BY rank, pg_name
        ), status AS (
            SELECT rank, pg_name, max(last_completed) AS s_completed FROM fr_pgs WHERE job = ? GROUP BY ALL
        )
        SELECT m.pg_name, p.pg_desc, p.n, m.rank, l.last_seq, l.last_op, l.last_state, c.c_seq, c.c_op,
               s.s_completed, d.rank IS NOT NULL AS has_dump
        FROM members m JOIN pgmax p USING (pg_name)
        LEFT JOIN last l USING (pg_name, rank) LEFT JOIN comp c USING (pg_name, rank)
        LEFT JOIN status s USING (pg_name, rank)
        LEFT JOIN fr_dumps d ON d.job = ? AND d.rank = m.rank
        ORDER BY m.pg_name, m.rank""", [job, job, job, job]).fetchall()
    at_max = {(pg, n): (op, states) for pg, n, op, states in con.execute("""
        WITH e AS (SELECT * FROM fr_entries WHERE job = ? AND NOT coalesce(is_p2p, false) AND seq > 0),
             mx AS (SELECT pg_name, max(seq) AS n FROM e GROUP BY pg_name)
        SELECT e.pg_name, e.seq, mode(e.op), list(DISTINCT coalesce(e.state, 'unknown') ORDER BY coalesce(e.state, 'unknown'))
        FROM e JOIN mx ON mx.pg_name = e.pg_name AND mx.n = e.seq GROUP BY ALL""", [job]).fetchall()}
    mismatches: dict = {}
    for pg, seq, ops, ranks in con.execute("""
        SELECT pg_name, seq, list(DISTINCT op ORDER BY op), list(DISTINCT rank ORDER BY rank) FROM fr_entries
        WHERE job = ? AND NOT coalesce(is_p2p, false) AND seq > 0
        GROUP BY pg_name, seq HAVING count(DISTINCT op) > 1 ORDER BY pg_name, seq""", [job]).fetchall():
        mismatches.setdefault(pg, []).append({"seq": seq, "ops": ops, "ranks": ranks})
    groups: dict = {}
    for pg, desc, n, rank, last_seq, last_op, last_state, c_seq, c_op, s_comp, has_dump in per_rank:
        g = groups.setdefault(pg, {"pg_name": pg, "pg_desc": desc, "max_seq": n,
                                   "op_at_max": at_max.get((pg, n), (None, []))[0],
                                   "states_at_max": at_max.get((pg, n), (None, []))[1],
                                   "members": [], "reached": [], "missing": [], "ranks": [],
                                   "op_mismatches": mismatches.get(pg, [])})
        g["members"].append(rank)
        (g["reached"] if last_seq is not None and last_seq >= n else g["missing"]).append(rank)
        g["ranks"].append({"rank": rank, "has_dump": bool(has_dump), "last_seq": last_seq, "last_op": last_op,
                           "last_state": last_state, "last_completed_seq": c_seq, "last_completed_op": c_op,
                           "status_last_completed": s_comp})
    for g in groups.values():
        g["hung"] = bool(g["missing"]) or bool(g["op_mismatches"])
    n_dumps = con.execute("SELECT count(*) FROM fr_dumps WHERE job = ?", [job]).fetchone()[0]
    return {"job": job, "n_dumps": n_dumps, "process_groups": sorted(groups.values(), key=lambda g: _pg_key(g["pg_name"])),
            "hung_groups": [g["pg_name"] for g in sorted(groups.values(), key=lambda g: _pg_key(g["pg_name"]))
                            if g["hung"]]}


def _pg_key(name):
    return (0, int(name), "") if str(name).isdigit() else (1, 0, str(name))


def format_table(rep: dict) -> str:
    lines = [f"job {rep['job']}: {rep['n_dumps']} Flight Recorder dumps; hung groups: "
             + (", ".join(rep["hung_groups"]) or "none")]
    for g in rep["process_groups"]:
        state = "HUNG" if g["hung"] else "ok"
        lines.append(f"pg {g['pg_name']} ({g['pg_desc']}) {state}: max seq {g['max_seq']} {g['op_at_max']} "
                     f"[{','.join(str(x) for x in g['states_at_max'])}]; members {_ranges(g['members'])}; "
                     f"never reached it: {_ranges(g['missing']) or '-'}")
        for m in g["op_mismatches"]:
            lines.append(f"    op mismatch at seq {m['seq']}: {', '.join(m['ops'])} (ranks {_ranges(m['ranks'])})")
        if g["hung"]:
            lines.append(f"    {'rank':>5s} {'last_seq':>8s} {'last_op':24s} {'state':10s} {'completed':>9s} last_completed_op")
            for r in g["ranks"]:
                lines.append(f"    {r['rank']:5d} {_s(r['last_seq']):>8s} {_s(r['last_op']):24s} {_s(r['last_state']):10s} "
                             f"{_s(r['last_completed_seq']):>9s} {_s(r['last_completed_op'])}"
                             + ("" if r["has_dump"] else "  (no dump)"))
    return "\n".join(lines)


def _s(v):
    return "-" if v is None else str(v)


def _ranges(xs) -> str:
    xs = sorted(xs)
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)
