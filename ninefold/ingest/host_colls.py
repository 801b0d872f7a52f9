"""Collectives that no named ``record_param_comms`` describes, recovered from the host ops that launched them.

Older PyTorch (before the 2.2 era) records ``record_param_comms`` with no arguments (only ``Input Dims`` /
``Input type``: no collective name, process group or sequence), and some traces have no such op at all. The
host side still says what the collective was: the communication kernel is launched (by correlation, on the
launching thread) inside ``c10d::alltoall_base_`` / ``nccl:all_to_all`` / ``c10d::allreduce_`` / … . Each such
kernel becomes a ``collectives`` row typed by the innermost host op that names a collective, with no process
group or sequence: attribution matches it across ranks by its order within (group, collective type).
A kernel that a named ``record_param_comms`` already describes is left to that row.
"""
from __future__ import annotations

# (regular expression on the lower-cased host op name, collective type), first match wins. Backend ops
# (nccl:, rccl:, gloo:) and the c10d dispatcher ops; names pinned on real captures (gloo) and the shared corpus.
HOST_COLL_RULES = [
    (r"^(nccl|rccl|gloo):all_?to_all|^c10d::all_?to_?all|all_to_all_single", "all_to_all"),
    (r"^(nccl|rccl|gloo):all_?reduce|^c10d::allreduce", "allreduce"),
    (r"^(nccl|rccl|gloo):_?all_?gather|^c10d::_?all_?gather", "all_gather"),
    (r"^(nccl|rccl|gloo):_?reduce_?scatter|^c10d::_?reduce_?scatter", "reduce_scatter"),
    (r"^(nccl|rccl|gloo):broadcast|^c10d::broadcast", "broadcast"),
    (r"^(nccl|rccl|gloo):reduce$|^c10d::reduce_?$", "reduce"),
    (r"^(nccl|rccl|gloo):barrier|^c10d::barrier", "barrier"),
    (r"^(nccl|rccl|gloo):send|^c10d::send", "send"),
    (r"^(nccl|rccl|gloo):recv|^c10d::recv", "recv"),
]


def host_coll_case(col: str = "name") -> str:
    """SQL CASE giving the collective type a host op name stands for (NULL when it names none)."""
    arms = " ".join(f"WHEN regexp_matches(lower({col}), '{rx}') THEN '{c}'" for rx, c in HOST_COLL_RULES)
    return f"CASE {arms} END"


def host_coll_type(name: str) -> str | None:
    """The collective type a host op name stands for, or None (the same rules, in Python)."""
    import re

    n = (name or "").lower()
    for rx, c in HOST_COLL_RULES:
        if re.search(rx, n):
            return c
    return None


def insert_host_collectives(con, job: str, rank: int) -> int:
    """Add a collectives row for every communication kernel (ninefold.analysis.classify) of (JOB, RANK) launched inside a
    host op that names a collective and not already described by a collectives row; returns how many were added."""
    from ninefold.analysis.classify import is_comm

    comm = sorted(n for (n,) in con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = ? AND rank = ? AND "
                                            "kind = 'kernel' AND name IS NOT NULL", [job, rank]).fetchall()
                  if is_comm(n))
    if not comm:
        return 0
    before = con.execute("SELECT count(*) FROM collectives WHERE job = ? AND rank = ?", [job, rank]).fetchone()[0]
    con.execute(f"""INSERT INTO collectives
        WITH named AS (
            SELECT pid, tid, start_ns, end_ns, depth, {host_coll_case()} AS coll FROM host_ops
            WHERE job = $1 AND rank = $2 AND cat NOT IN ('cuda_runtime', 'cuda_driver')
                AND (name LIKE 'c10d::%' OR name LIKE 'nccl:%' OR name LIKE 'rccl:%' OR name LIKE 'gloo:%'
                     OR name LIKE '%all_to_all_single%')
        ), launch AS (
            SELECT pid, tid, correlation, min(start_ns) AS t FROM host_ops
            WHERE job = $1 AND rank = $2 AND cat IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
            GROUP BY ALL
        ), k AS (
            SELECT g.name, g.start_ns, g.end_ns, g.correlation, g.external_id FROM gpu_ops g
            WHERE g.job = $1 AND g.rank = $2 AND g.kind = 'kernel' AND list_contains($3, g.name)
                AND NOT EXISTS (SELECT 1 FROM collectives c WHERE c.job = $1 AND c.rank = $2
                                AND c.source = 'kernel' AND c.start_ns = g.start_ns AND c.kernel_name = g.name)
        )
        SELECT $1, $2, NULL, NULL, NULL, NULL, arg_max(n.coll, n.depth), NULL, NULL, NULL, NULL, NULL,
               k.start_ns, k.end_ns, k.name, any_value(k.external_id), 'kernel'
        FROM k JOIN launch l ON l.correlation = k.correlation
               JOIN named n ON n.pid = l.pid AND n.tid = l.tid AND l.t >= n.start_ns AND l.t < n.end_ns
        WHERE n.coll IS NOT NULL
        GROUP BY k.start_ns, k.end_ns, k.name, k.correlation
        ORDER BY k.start_ns""", [job, rank, comm])
    after = con.execute("SELECT count(*) FROM collectives WHERE job = ? AND rank = ?", [job, rank]).fetchone()[0]
    return after - before
