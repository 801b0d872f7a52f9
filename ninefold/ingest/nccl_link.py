"""Link NCCL COLL lines (nccl_colls) to the profiler's collectives of the same job → nccl_coll_links.

A profiler collective knows its process group and c10d sequence number; a COLL line knows its communicator,
opCount and, from the TUNING line of its launch, algorithm, protocol and channels. Neither side names the
other, so the link is found in three steps, all in SQL:

1. keys. NCCL side: ``op_count`` when it moves on that communicator (it counts launches; NCCL 2.27 single-node
   logs print 0 throughout), else the op's position on the communicator. Profiler side: ``seq`` when the
   group has one, else the position on the group. Method ``seq_opcount`` when both real counters exist,
   else ``order``.
2. per rank, which communicator is which group, and the offset between their keys: every pair of a COLL line
   and a profiler collective of the same rank with the same op, nranks = group size and element count
   votes for (communicator, group, key difference). The most voted (group, offset) wins for each
   communicator (ties: the offset nearest the usual one, seq = opCount + 1, or 0 for positions), and a group
   goes to one communicator. The vote copes with logs that cover more of the run than the profiler window.
3. the links: COLL lines whose key plus that offset is a profiler key of the paired group, same op.
"""
from __future__ import annotations

from ninefold.store.connection import abort

OP_NORM = """CASE regexp_replace(regexp_replace(lower({c}), '[^a-z]', '', 'g'),
                                 '(intotensor|tensor|base|coalesced|single)$', '')
    WHEN 'allreduce' THEN 'allreduce' WHEN 'allgather' THEN 'allgather' WHEN 'reducescatter' THEN 'reducescatter'
    WHEN 'broadcast' THEN 'broadcast' WHEN 'reduce' THEN 'reduce' WHEN 'alltoall' THEN 'alltoall'
    WHEN 'alltoallv' THEN 'alltoall' WHEN 'send' THEN 'send' WHEN 'recv' THEN 'recv' WHEN 'gather' THEN 'gather'
    WHEN 'scatter' THEN 'scatter' WHEN 'barrier' THEN 'allreduce'
    ELSE regexp_replace(lower({c}), '[^a-z]', '', 'g') END"""
MAX_VOTERS = 512  # profiler collectives per (rank, group) that vote; bounds the pair count


def link_profiler_collectives(con, job: str) -> dict:
    """Rebuild nccl_coll_links for JOB. Returns {"links": n, "pairs": [(rank, comm, pg_name, method, offset)]}."""
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _lk_n AS
        WITH c AS (
            SELECT file, host, pid, comm, rank, line_no, {OP_NORM.format(c='op')} AS op_norm, count, nranks,
                   op_count, group_index, algorithm, protocol, n_channels,
                   row_number() OVER (PARTITION BY file, host, pid, comm ORDER BY line_no) - 1 AS ord
            FROM nccl_colls WHERE job = ? AND rank IS NOT NULL AND comm IS NOT NULL
        ), inf AS (
            SELECT file, host, pid, comm, count(DISTINCT op_count) > 1 AS informative FROM c GROUP BY ALL
        )
        SELECT c.*, inf.informative FROM c JOIN inf USING (file, host, pid, comm)""", [job])
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _lk_p AS
        WITH c AS (
            SELECT rank, coalesce(pg_name, '') AS pg_name, seq, coll, start_ns, in_nelems, out_nelems, group_size,
                   {OP_NORM.format(c='coll')} AS op_norm,
                   row_number() OVER (PARTITION BY rank, coalesce(pg_name, '') ORDER BY start_ns, seq) - 1 AS ord,
                   row_number() OVER (PARTITION BY rank, coalesce(pg_name, ''), seq ORDER BY start_ns) - 1 AS gi
            FROM collectives WHERE job = ?
        ), hs AS (SELECT rank, pg_name, count(seq) = count(*) AND count(DISTINCT seq) > 1 AS has_seq FROM c GROUP BY ALL)
        SELECT c.*, hs.has_seq FROM c JOIN hs USING (rank, pg_name)""", [job])
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _lk_pair AS
        WITH cand AS (
            SELECT n.rank, n.file, n.host, n.pid, n.comm, p.pg_name,
                   n.informative AND p.has_seq AS by_seq,
                   CASE WHEN n.informative AND p.has_seq THEN p.seq - n.op_count ELSE p.ord - n.ord END AS d
            FROM _lk_n n JOIN _lk_p p
              ON p.rank = n.rank AND p.op_norm = n.op_norm AND p.group_size = n.nranks
             AND (n.count IS NULL OR n.count = p.in_nelems OR n.count = p.out_nelems)
             AND (CASE WHEN n.informative AND p.has_seq THEN n.group_index = p.gi ELSE true END)
            WHERE p.ord < {MAX_VOTERS}
        ), votes AS (
            SELECT rank, file, host, pid, comm, pg_name, by_seq, d, count(*) AS v FROM cand GROUP BY ALL
        ), best_comm AS (
            SELECT *, row_number() OVER (PARTITION BY rank, file, host, pid, comm
                                         ORDER BY v DESC, abs(d - CASE WHEN by_seq THEN 1 ELSE 0 END), d) AS k
            FROM votes
        ), best_pg AS (
            SELECT *, row_number() OVER (PARTITION BY rank, pg_name ORDER BY v DESC, file, host, pid, comm) AS k2
            FROM best_comm WHERE k = 1
        )
        SELECT rank, file, host, pid, comm, pg_name, by_seq, d, v FROM best_pg WHERE k2 = 1""")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM nccl_coll_links WHERE job = ?", [job])
        con.execute("""INSERT INTO nccl_coll_links
            SELECT ?, n.rank, nullif(p.pg_name, ''), p.seq, p.coll, p.start_ns, n.file, n.line_no, n.comm, n.op_count,
                   CASE WHEN pr.by_seq THEN 'seq_opcount' ELSE 'order' END, n.algorithm, n.protocol, n.n_channels
            FROM _lk_pair pr
            JOIN _lk_n n ON n.rank = pr.rank AND n.file = pr.file AND n.host IS NOT DISTINCT FROM pr.host
                        AND n.pid IS NOT DISTINCT FROM pr.pid AND n.comm = pr.comm
            JOIN _lk_p p ON p.rank = pr.rank AND p.pg_name = pr.pg_name AND p.op_norm = n.op_norm
                        AND (CASE WHEN pr.by_seq THEN p.seq = n.op_count + pr.d AND p.gi = n.group_index
                                  ELSE p.ord = n.ord + pr.d END)
            ORDER BY n.rank, p.start_ns""", [job])
        con.execute("COMMIT")
    except BaseException as e:
        abort(con, e, "the NCCL log links")
        raise
    pairs = con.execute("""SELECT rank, comm, nullif(pg_name, ''), CASE WHEN by_seq THEN 'seq_opcount' ELSE 'order' END, d
                           FROM _lk_pair ORDER BY rank, comm""").fetchall()
    n = con.execute("SELECT count(*) FROM nccl_coll_links WHERE job = ?", [job]).fetchone()[0]
    for t in ("_lk_n", "_lk_p", "_lk_pair"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return {"links": n, "pairs": pairs}


def collective_detail(con, job: str, rank: int, pg_name: str | None, seq: int | None) -> dict | None:
    """Drill-down for one profiler collective: its NCCL algorithm, protocol, channels and log line."""
    from ninefold.ingest.nccl_log import first

    row = first(con, """SELECT l.coll, l.start_ns, l.algorithm, l.protocol, l.n_channels, l.comm, l.op_count, l.method,
                                l.file, l.line_no, c.count, c.dtype, c.bytes, c.nranks
                         FROM nccl_coll_links l
                         LEFT JOIN nccl_colls c ON c.job = l.job AND c.file = l.file AND c.line_no = l.line_no
                                              AND c.comm = l.comm
                         WHERE l.job = ? AND l.rank = ? AND l.pg_name IS NOT DISTINCT FROM ? AND l.seq IS NOT DISTINCT FROM ?
                         ORDER BY l.start_ns LIMIT 1""", [job, rank, pg_name, seq])
    if row is None:
        return None
    keys = ["coll", "start_ns", "algorithm", "protocol", "n_channels", "comm", "op_count", "method", "file", "line_no",
            "count", "dtype", "bytes", "nranks"]
    return dict(zip(keys, row))
