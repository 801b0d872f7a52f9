"""NCCL debug logs (``NCCL_DEBUG=INFO``) → nccl_comms, nccl_topology, nccl_colls, nccl_events.

Every step is columnar: Python reads the bytes and splits them into lines (C-level ``str.split``); DuckDB
does the rest with RE2 regexes over the whole column (``regexp_extract`` into structs,
``regexp_replace`` + ``string_split`` + ``unnest`` to cut fused lines apart, ASOF joins to attach the
TUNING line of a launch to its COLL lines). No Python loop runs per line.

What the parser copes with (formats.md §3):

* launcher prefixes before the NCCL prefix: Ray ``(RayTrainWorker pid=.., ip=..)``, OpenMPI
  ``[1,0]<stdout>:``, ``[0]`` tags, srun ``0: ``, torchrun ``[rank3]:``, wall-clock stamps;
* fused lines, when two processes wrote into one line: the line is cut at every
  ``host:pid:tid [dev] NCCL INFO`` prefix. A prefix whose message is empty is *pending*; a later line that
  starts with bare NCCL message text (no prefix) is its continuation, matched first-in first-out.
  Hostnames glued to the tail of an earlier message (``cudaDev 0ljm:1:2 [1] NCCL INFO``) are cut back to
  a hostname seen at the start of a line;
* truncated COLL lines: every field up to the cut is kept, the rest is NULL, ``truncated`` is set;
* PyTorch c10 lines (``[rank0]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] ... Watchdog caught ...``),
  NCCL WARN lines and NCCL's error-return traces (``misc/socket.cc:47 -> 3``) become nccl_events.

What could not be recovered is counted in ``diagnostics`` (source ``nccl_log``); each example starts with
``<file>:<line>:``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from ninefold.ingest.registry import Loader
from ninefold.ingest.common import read_nonempty
from ninefold.store.connection import abort
from ninefold.store.errors import IngestConflict, TraceFormatError

SOURCE = "nccl_log"

# ncclDataType_t (src/nccl.h.in) -> (name, bytes)
NCCL_DTYPES = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
               5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2),
               10: ("float8e4m3", 1), 11: ("float8e5m2", 1)}
NCCL_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

MARKER = re.compile(rb"NCCL (?:INFO|WARN|TRACE)\b|(?:NCCL|RCCL) version \d|\[[EW]\d{3,4} [\d:.]+ ProcessGroupNCCL\.cpp:")
TESTS_HEADER = re.compile(rb"#\s+size\s+count\s+type")

# ---- regexes (RE2 syntax, used inside DuckDB)
# launcher prefixes, any number of them, at the start of a physical line
LAUNCH = (r"^(?:\s*(?:\(\w+ pid=\d+(?:, ip=[0-9.]+)?\)|\[\d+,\d+\]<std(?:out|err)>:|\[rank\d+\]:|\[\d+\]"
          r"|\d+: |\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?\]?))+\s*")
LAUNCH_RANK = r"\[rank(\d+)\]:|\[\d+,(\d+)\]<std|^\s*(\d+): "
STAMP = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?"
# the NCCL line prefix; fused lines hold several
PFX = r"[A-Za-z0-9_.\-]+:\d+:\d+ (?:\[\d+\] )?(?:\S+ ){0,2}(?:\(\w+\) )?NCCL (?:INFO|WARN|TRACE|CALL|ABORT)\b ?"
PFX_PARTS = (r"^([A-Za-z0-9_.\-]+):(\d+):(\d+) (?:\[(\d+)\] )?((?:\S+ ){0,2}(?:\(\w+\) )?)"
             r"NCCL (INFO|WARN|TRACE|CALL|ABORT)\b ?(.*)$")
PFX_NAMES = ["host", "pid", "tid", "dev", "loc", "level", "msg"]
# bare text that is an NCCL message (the continuation of a pending prefix)
NCCL_MSG = (r"^(?:[A-Z][A-Za-z]+: opCount [0-9a-f]+ |[A-Z][A-Za-z]+: \d+ Bytes -> |Ring \d+ : |Channel \d+/?\d* : "
            r"|Trees \[|(?:\w+ )?comm 0x[0-9a-f]+ rank \d+ n[Rr]anks |NVLS Head|Connected all |\d+ coll channels"
            r"|Setting affinity|Launch mode|P2P Chunksize|Bootstrap ?: |Using network )")
COLL_HEAD = r"^([A-Z][A-Za-z]+): opCount ([0-9a-f]+) "
COLL_LENIENT = (COLL_HEAD + r"(?:sendbuff (\S+) )?(?:recvbuff (\S+) )?(?:acc (\S+) )?(?:count (\d+) )?"
                r"(?:datatype (\d+) )?(?:op (\d+) )?(?:root (-?\d+) )?(?:comm (0x[0-9a-f]+) )?"
                r"(?:\[nranks=(\d+)\] )?")
COLL_NAMES = ["op", "opcount", "sendbuff", "recvbuff", "acc", "count", "datatype", "redop", "root", "comm", "nranks"]
COLL_STRICT = (COLL_HEAD + r"sendbuff \S+ recvbuff \S+ (?:acc \S+ )?count \d+ datatype \d+ op \d+ root -?\d+ "
               r"comm 0x[0-9a-f]+ \[nranks=\d+\] stream (0x[0-9a-f]+|\(nil\))$")
TUNING = (r"^([A-Z][A-Za-z]+): (\d+) Bytes -> Algo (\w+) proto (\w+)"
          r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?")
TUNING_NAMES = ["op", "nbytes", "algo", "proto", "lo", "hi"]
INIT = (r"(?:^|\] |^(\w+) )comm (0x[0-9a-f]+) rank (\d+) nranks (\d+) cudaDev (\d+)(?: nvmlDev (\d+))?"
        r"(?: busId ([0-9a-f]+))?(?: commId (0x[0-9a-f]+))?(?: parent (0x[0-9a-f]+|\(nil\)))?")
INIT_NAMES = ["func", "comm", "rank", "nranks", "dev", "nvml", "bus", "commid", "parent"]
INIT_ANY = r"comm 0x[0-9a-f]+ rank \d+ nranks "
TOPO = r"comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)"
RING_ORDER = r"^Channel (\d+)/(\d+) :\s+(-?\d+(?:\s+-?\d+)*)\s*$"
LINK = (r"^(Channel|Ring) (\d+)(?:/(\d+))? : (\d+)\[(\d+)\] -> (\d+)\[(\d+)\](?: \[(send|receive)\])?"
        r" via (\S.*?)\s*$")
RING3 = r"^Ring (\d+) : (-?\d+) -> (\d+) -> (-?\d+)\s*$"
TREE_ITEM = r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)"
NVLS = r"^NVLS Head\s+(\d+):\s+(\d+(?:\s+\d+)*)\s*$"
VERSION = r"(?:^|\s)(?:NCCL|RCCL) version (\S+)"
ERRTRACE = r"^([\w/.\-]+\.(?:cc|cu|cpp|c|h)):(\d+) -> (\d+)"
TORCH = r"^\[([EWF])(\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?) (?:\d+ )?([\w.]+:\d+)\] (.*)$"

GARBAGE = "[\\x00-\\x08\\x0e-\\x1f\\x7f\ufffd]"


def first(con, sql: str, params=None):
    """The first row or None, reading the whole result (DuckDB keeps a half-read result pending)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


def q(s: str) -> str:
    """SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


# ------------------------------------------------------------------ reading
def sniff(path: Path, head: bytes) -> bool:
    """An NCCL log: its head has NCCL INFO/WARN markers and no nccl-tests table header (that file is
    nccl_tests's, which also takes its NCCL lines)."""
    if not head or head.lstrip()[:1] in (b"{", b"[") and b'"traceEvents"' in head:
        return False
    return bool(MARKER.search(head)) and not TESTS_HEADER.search(head)


def read_text(path: Path) -> tuple[bytes, str]:
    data = read_nonempty(path)
    text = data.decode("utf-8", errors="replace")
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return data, text


def lines_table(text: str) -> pa.Table:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return pa.table({"line_no": pa.array(range(1, len(lines) + 1), pa.int64()), "raw": pa.array(lines, pa.string())})


# ------------------------------------------------------------------ staging (temp tables, no writes)
def stage(con, path: Path, text: str, rank: int | None = None, salvage: bool = False,
          require_nccl: bool = True) -> dict:
    """Parse TEXT into the temp tables _nl_* (nothing is written to the store). Returns a summary dict.
    Raises TraceFormatError for input that is not an NCCL log."""
    fname = str(Path(path).resolve())
    con.register("_nl_arrow", lines_table(text))
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_raw AS
        SELECT line_no, rtrim(raw, chr(13)) AS raw,
               regexp_matches(raw, {q(GARBAGE)}) AS garbage FROM _nl_arrow""")
    con.unregister("_nl_arrow")
    n_lines, n_garbage, first_bad = con.execute(
        "SELECT count(*), count(*) FILTER (garbage), min(line_no) FILTER (garbage) FROM _nl_raw").fetchone()
    diags: list[tuple[str, int, str]] = []
    if n_garbage:
        ex = first(con, "SELECT left(raw, 80) FROM _nl_raw WHERE line_no = ?", [first_bad])[0]
        if not salvage:
            raise TraceFormatError(path, f"line {first_bad}", f"binary data in a text log ({n_garbage} of "
                                   f"{n_lines} lines); pass --salvage to skip such lines")
        diags.append(("binary_garbage", n_garbage, f"{fname}:{first_bad}: {ex!r}"))

    # launcher prefixes off, then cut fused lines at every NCCL prefix
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_l AS
        SELECT line_no, raw,
               regexp_extract(raw, {q(LAUNCH)}) AS lp,
               regexp_replace(raw, {q(LAUNCH)}, '') AS body
        FROM _nl_raw WHERE NOT garbage""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_seg AS
        WITH s AS (
            SELECT line_no, lp, string_split(regexp_replace(body, {q(PFX)}, chr(1) || '\\0', 'g'), chr(1)) AS parts
            FROM _nl_l)
        SELECT line_no, lp, unnest(parts) AS seg, unnest(range(len(parts))) AS si FROM s""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_p AS
        SELECT line_no, si, lp, seg, regexp_extract(seg, {q(PFX_PARTS)}, {PFX_NAMES}) AS p
        FROM _nl_seg WHERE si > 0 OR trim(seg) <> ''""")
    # hostnames glued to the tail of the previous message: cut back to a host seen at a line start
    con.execute("""CREATE OR REPLACE TEMP TABLE _nl_r AS
        WITH known AS (
            SELECT DISTINCT p.host AS h FROM _nl_p a
            WHERE si = 1 AND NOT EXISTS (SELECT 1 FROM _nl_p b WHERE b.line_no = a.line_no AND b.si = 0)
        ), fix AS (
            SELECT a.line_no, a.si,
                   (SELECT max_by(k.h, length(k.h)) FROM known k
                    WHERE a.si > 0 AND a.p.host NOT IN (SELECT h FROM known) AND a.p.host LIKE '%' || k.h) AS h2,
                   a.p, a.seg, a.lp
            FROM _nl_p a
        ), cut AS (
            SELECT *, CASE WHEN h2 IS NOT NULL THEN left(p.host, length(p.host) - length(h2)) ELSE '' END AS extra
            FROM fix
        )
        SELECT line_no, si, lp,
               si > 0 AS has_prefix,
               CASE WHEN si > 0 THEN coalesce(h2, p.host) END AS host,
               TRY_CAST(nullif(p.pid, '') AS BIGINT) AS pid, TRY_CAST(nullif(p.tid, '') AS BIGINT) AS tid,
               TRY_CAST(nullif(p.dev, '') AS INTEGER) AS dev,
               nullif(trim(p.loc), '') AS loc, CASE WHEN si > 0 THEN p.level END AS level,
               trim(CASE WHEN si > 0 THEN p.msg ELSE seg END
                    || coalesce(lead(extra) OVER (PARTITION BY line_no ORDER BY si), '')) AS msg,
               h2 IS NOT NULL AS host_fixed
        FROM cut""")
    # pending prefixes (empty message) take the next bare NCCL message text, first in first out
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_pair AS
        WITH pend AS (
            SELECT line_no, si, row_number() OVER (ORDER BY line_no, si) AS k FROM _nl_r
            WHERE has_prefix AND msg = '' AND level = 'INFO'
        ), orph AS (
            SELECT line_no, si, msg, row_number() OVER (ORDER BY line_no, si) AS k FROM _nl_r
            WHERE NOT has_prefix AND regexp_matches(msg, {q(NCCL_MSG)})
        )
        SELECT pend.line_no AS p_line, pend.si AS p_si, orph.line_no AS o_line, orph.si AS o_si, orph.msg
        FROM pend JOIN orph ON orph.k = pend.k
        WHERE orph.line_no > pend.line_no OR (orph.line_no = pend.line_no AND orph.si > pend.si)""")
    con.execute("""CREATE OR REPLACE TEMP TABLE _nl_rec AS
        SELECT r.line_no, r.si, r.line_no * 10000 + r.si AS pos, r.lp, r.has_prefix, r.host, r.pid, r.tid, r.dev,
               r.loc, r.level,
               CASE WHEN pr.o_line IS NOT NULL THEN pr.msg ELSE r.msg END AS msg,
               pr.o_line IS NOT NULL AS recovered, r.host_fixed
        FROM _nl_r r
        LEFT JOIN _nl_pair pr ON pr.p_line = r.line_no AND pr.p_si = r.si
        WHERE NOT EXISTS (SELECT 1 FROM _nl_pair x WHERE x.o_line = r.line_no AND x.o_si = r.si)""")
    n_pending_lost, ex_pend = con.execute("""SELECT count(*), any_value(line_no) FROM _nl_rec
        WHERE has_prefix AND msg = '' AND level = 'INFO'""").fetchone()
    if n_pending_lost:
        diags.append(("interleaved_unrecovered", n_pending_lost,
                      f"{fname}:{ex_pend}: a fused line left an NCCL prefix with no message"))
    n_rec = con.execute("SELECT count(*) FROM _nl_pair").fetchone()[0]
    if n_rec:
        ex = con.execute("SELECT min(o_line) FROM _nl_pair").fetchone()[0]
        diags.append(("interleaved_recovered", n_rec, f"{fname}:{ex}: message text joined to its prefix"))
    n_fix = con.execute("SELECT count(*), min(line_no) FROM _nl_rec WHERE host_fixed").fetchone()
    if n_fix[0]:
        diags.append(("interleaved_host_cut", n_fix[0], f"{fname}:{n_fix[1]}: hostname fused to the previous message"))

    n_nccl = con.execute("SELECT count(*) FROM _nl_rec WHERE has_prefix").fetchone()[0]
    has_version = con.execute(f"SELECT count(*) FROM _nl_rec WHERE regexp_matches(msg, {q(VERSION)})").fetchone()[0]
    has_torch = con.execute(f"SELECT count(*) FROM _nl_rec WHERE NOT has_prefix AND regexp_matches(msg, {q(TORCH)})"
                            ).fetchone()[0]
    if require_nccl and n_nccl == 0 and not has_version and not has_torch:
        raise TraceFormatError(path, None, "no NCCL log lines (no 'host:pid:tid [dev] NCCL INFO' prefix, no "
                               "ProcessGroupNCCL line): not an NCCL debug log")
    _stage_kinds(con, rank, fname, diags)
    summary = con.execute("""SELECT
        (SELECT count(*) FROM _nl_colls), (SELECT count(*) FROM _nl_events WHERE level = 'WARN'),
        (SELECT string_agg(DISTINCT host, ',' ORDER BY host) FROM _nl_rec WHERE host IS NOT NULL)""").fetchone()
    version = first(con, f"""SELECT regexp_extract(msg, {q(VERSION)}, 1) FROM _nl_rec
        WHERE regexp_matches(msg, {q(VERSION)}) ORDER BY pos LIMIT 1""")
    n_parsed = con.execute("SELECT count(*) FROM _nl_rec WHERE kind IS NOT NULL").fetchone()[0]
    return {"file": fname, "n_lines": n_lines, "n_nccl": n_nccl, "n_parsed": n_parsed, "n_colls": summary[0],
            "n_warn": summary[1], "hosts": summary[2], "nccl_version": version[0] if version else None,
            "diags": diags, "salvaged": bool(n_garbage)}


def _stage_kinds(con, rank, fname, diags) -> None:
    rank_sql = "NULL" if rank is None else str(int(rank))
    # kind of every record
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_k AS
        SELECT *, CASE
            WHEN regexp_matches(msg, {q(COLL_HEAD)}) THEN 'coll'
            WHEN regexp_matches(msg, {q(TUNING)}) THEN 'tuning'
            WHEN regexp_matches(msg, {q(TOPO)}) THEN 'comm_topo'
            WHEN regexp_matches(msg, {q(INIT_ANY)}) THEN 'init'
            WHEN regexp_matches(msg, {q(RING_ORDER)}) THEN 'ring_order'
            WHEN regexp_matches(msg, {q(LINK)}) THEN 'link'
            WHEN regexp_matches(msg, {q(RING3)}) THEN 'ring3'
            WHEN regexp_matches(msg, '^Trees \\[') THEN 'tree'
            WHEN regexp_matches(msg, {q(NVLS)}) THEN 'nvls'
            WHEN regexp_matches(msg, {q(VERSION)}) THEN 'version'
            WHEN has_prefix AND level = 'WARN' THEN 'warn'
            WHEN has_prefix AND regexp_matches(msg, {q(ERRTRACE)}) THEN 'errtrace'
            WHEN NOT has_prefix AND regexp_matches(msg, {q(TORCH)}) THEN 'torch'
            END AS kind,
            nullif(coalesce(regexp_extract(lp, {q(LAUNCH_RANK)}, 1), '')
                   || coalesce(regexp_extract(lp, {q(LAUNCH_RANK)}, 2), '')
                   || coalesce(regexp_extract(lp, {q(LAUNCH_RANK)}, 3), ''), '') AS lrank
        FROM _nl_rec""")
    con.execute("DROP TABLE IF EXISTS _nl_rec")
    con.execute("ALTER TABLE _nl_k RENAME TO _nl_rec")
    # a decimal field too long for a 64-bit integer is kept as NULL (TRY_CAST below), and counted here
    n_big = con.execute("""SELECT count(*), min(line_no) FROM _nl_rec WHERE kind IS NOT NULL
                           AND regexp_matches(msg, '(^|[^0-9A-Za-z])[0-9]{20,}')""").fetchone()
    if n_big[0]:
        diags.append(("number_out_of_range", n_big[0],
                      f"{fname}:{n_big[1]}: a number too large for a 64-bit integer, stored as NULL"))

    # ---- communicators: Init START/COMPLETE lines, plus the nRanks/nNodes topology line
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_init AS
        SELECT host, pid, line_no, pos, msg, regexp_extract(msg, {q(INIT)}, {INIT_NAMES}) AS m,
               CASE WHEN contains(msg, 'Init COMPLETE') THEN 'COMPLETE' WHEN contains(msg, 'Init START') THEN 'START'
                    ELSE 'partial' END AS status
        FROM _nl_rec WHERE kind = 'init'""")
    n_partial = con.execute("SELECT count(*), min(line_no) FROM _nl_init WHERE m.comm = ''").fetchone()
    if n_partial[0]:
        diags.append(("init_fragment", n_partial[0], f"{fname}:{n_partial[1]}: init line cut before cudaDev"))
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_comms AS
        WITH i AS (
            SELECT host, pid, m.comm AS comm, nullif(m.commid, '') AS comm_id, TRY_CAST(m.rank AS INTEGER) AS rank,
                   TRY_CAST(m.nranks AS INTEGER) AS nranks, TRY_CAST(m.dev AS INTEGER) AS device,
                   TRY_CAST(nullif(m.nvml, '') AS INTEGER) AS nvml_dev, nullif(m.bus, '') AS bus_id,
                   coalesce(nullif(m.func, ''), nullif(regexp_extract(msg, '(nccl\\w+) comm 0x', 1), '')) AS init_func,
                   nullif(m.parent, '') AS parent, status, line_no,
                   row_number() OVER (PARTITION BY host, pid, m.comm
                                      ORDER BY status = 'COMPLETE' DESC, status = 'START' DESC, pos DESC) AS pick
            FROM _nl_init WHERE m.comm <> ''
        ), t AS (
            SELECT host, pid, regexp_extract(msg, {q(TOPO)}, ['comm','rank','nr','nn','lr','l']) AS m
            FROM _nl_rec WHERE kind = 'comm_topo'
        ), tt AS (
            SELECT host, pid, m.comm AS comm, any_value(TRY_CAST(m.rank AS INTEGER)) AS rank,
                   any_value(TRY_CAST(m.nr AS INTEGER)) AS nranks, any_value(TRY_CAST(m.nn AS INTEGER)) AS nnodes,
                   any_value(TRY_CAST(m.lr AS INTEGER)) AS local_ranks, any_value(TRY_CAST(m.l AS INTEGER)) AS local_rank
            FROM t GROUP BY ALL
        )
        SELECT coalesce(i.host, tt.host) AS host, coalesce(i.pid, tt.pid) AS pid, coalesce(i.comm, tt.comm) AS comm,
               i.comm_id, coalesce(i.rank, tt.rank) AS rank, coalesce(i.nranks, tt.nranks) AS nranks, i.device,
               i.nvml_dev, i.bus_id, tt.nnodes, tt.local_ranks, tt.local_rank, i.init_func, i.parent,
               coalesce(i.status, 'topology') AS status, i.line_no
        FROM (SELECT * FROM i WHERE pick = 1) i
        FULL JOIN tt ON tt.host = i.host AND tt.pid = i.pid AND tt.comm = i.comm""")

    # ---- collectives
    dt_case = " ".join(f"WHEN {k} THEN '{v[0]}'" for k, v in NCCL_DTYPES.items())
    sz_case = " ".join(f"WHEN {k} THEN {v[1]}" for k, v in NCCL_DTYPES.items())
    red_case = " ".join(f"WHEN {k} THEN '{v}'" for k, v in NCCL_REDOPS.items())
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_c AS
        SELECT line_no, pos, host, pid, tid, dev, recovered, lrank,
               regexp_extract(msg, {q(COLL_LENIENT)}, {COLL_NAMES}) AS m,
               nullif(regexp_extract(msg, {q(COLL_STRICT)}, 2), '') AS stream,
               regexp_matches(msg, {q(COLL_STRICT)}) AS complete
        FROM _nl_rec WHERE kind = 'coll'""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_t AS
        SELECT host, pid, pos, regexp_extract(msg, {q(TUNING)}, {TUNING_NAMES}) AS m
        FROM _nl_rec WHERE kind = 'tuning'""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_colls AS
        WITH c AS (
            SELECT line_no, pos, host, pid, tid, dev, recovered, lrank, m.op AS op,
                   TRY_CAST(('0x' || m.opcount) AS UBIGINT)::BIGINT AS op_count,
                   nullif(m.sendbuff, '') AS sendbuff, nullif(m.recvbuff, '') AS recvbuff,
                   TRY_CAST(nullif(m.count, '') AS BIGINT) AS count,
                   TRY_CAST(nullif(m.datatype, '') AS INTEGER) AS datatype,
                   TRY_CAST(nullif(m.redop, '') AS INTEGER) AS red_op,
                   TRY_CAST(nullif(m.root, '') AS INTEGER) AS root, nullif(m.comm, '') AS comm,
                   TRY_CAST(nullif(m.nranks, '') AS INTEGER) AS nranks, stream, NOT complete AS truncated
            FROM _nl_c
        ), t AS (
            SELECT host, pid, pos, m.op AS op, TRY_CAST(m.nbytes AS BIGINT) AS nbytes, m.algo AS algo,
                   m.proto AS proto, TRY_CAST(nullif(m.lo, '') AS INTEGER) AS lo,
                   TRY_CAST(nullif(m.hi, '') AS INTEGER) AS hi
            FROM _nl_t
        ), j AS (  -- the TUNING line of a launch follows its COLL lines (printed at group end)
            SELECT c.*, CASE c.datatype {sz_case} END AS esize, t.nbytes AS t_bytes, t.algo, t.proto, t.lo, t.hi
            FROM c ASOF LEFT JOIN t ON c.host = t.host AND c.pid = t.pid AND c.op = t.op AND t.pos > c.pos
        )
        SELECT j.host, j.pid, j.tid, j.dev AS device,
               coalesce(cm.rank, {rank_sql}, TRY_CAST(j.lrank AS INTEGER)) AS rank, j.comm, cm.comm_id,
               row_number() OVER (PARTITION BY j.host, j.pid, j.comm ORDER BY j.pos) - 1 AS coll_index,
               j.op, j.op_count,
               CAST(row_number() OVER (PARTITION BY j.host, j.pid, j.comm, j.op_count ORDER BY j.pos) - 1 AS INTEGER)
                   AS group_index,
               j.sendbuff, j.recvbuff, j.count, j.datatype, CASE j.datatype {dt_case} END AS dtype, j.red_op,
               CASE WHEN j.red_op >= 5 THEN 'premulsum' ELSE CASE j.red_op {red_case} END END AS reduction,
               j.root, coalesce(j.nranks, cm.nranks) AS nranks, j.stream, j.count * j.esize AS bytes,
               -- keep the tuning only when its byte count is this op's (per-rank or whole-buffer size)
               CASE WHEN ok THEN j.algo END AS algorithm, CASE WHEN ok THEN j.proto END AS protocol,
               CASE WHEN ok THEN j.lo END AS channel_lo, CASE WHEN ok THEN j.hi END AS channel_hi,
               CASE WHEN ok THEN j.hi - j.lo + 1 END AS n_channels,
               j.truncated, j.recovered, j.line_no
        FROM (SELECT *, t_bytes IN (count * esize, count * esize * coalesce(nranks, 1)) AS ok FROM j) j
        LEFT JOIN _nl_comms cm ON cm.host = j.host AND cm.pid = j.pid AND cm.comm = j.comm""")
    n_trunc = con.execute("SELECT count(*), min(line_no) FROM _nl_colls WHERE truncated").fetchone()
    if n_trunc[0]:
        diags.append(("truncated_coll", n_trunc[0], f"{fname}:{n_trunc[1]}: COLL line cut; fields after the cut are NULL"))
    n_norank = con.execute("SELECT count(*), min(line_no) FROM _nl_colls WHERE rank IS NULL").fetchone()
    if n_norank[0]:
        diags.append(("coll_without_rank", n_norank[0],
                      f"{fname}:{n_norank[1]}: no Init line for the comm of this COLL line; rank unknown"))
    n_orphan = con.execute("SELECT count(*), min(line_no) FROM _nl_colls WHERE host IS NULL").fetchone()
    if n_orphan[0]:
        diags.append(("orphan_fragment", n_orphan[0], f"{fname}:{n_orphan[1]}: NCCL message text with no prefix"))

    # ---- topology: ring orders, per-channel transport links, trees, NVLS heads
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_topo AS
        WITH devrank AS (  -- the rank of a device in a process, when it has exactly one comm there
            SELECT host, pid, device, min(rank) AS rank FROM _nl_comms WHERE device IS NOT NULL
            GROUP BY ALL HAVING count(DISTINCT rank) = 1
        ), r AS (
            SELECT host, pid, dev, line_no, kind, msg FROM _nl_rec
            WHERE kind IN ('ring_order', 'link', 'ring3', 'tree', 'nvls')
        ), ro AS (
            SELECT host, pid, dev, line_no, 'ring' AS kind, regexp_extract(msg, {q(RING_ORDER)}, ['c','n','o']) AS m
            FROM r WHERE kind = 'ring_order'
        ), lk AS (
            SELECT host, pid, dev, line_no, regexp_extract(msg, {q(LINK)}, ['w','c','n','s','sd','d','dd','dir','via']) AS m
            FROM r WHERE kind = 'link'
        ), r3 AS (
            SELECT host, pid, dev, line_no, regexp_extract(msg, {q(RING3)}, ['c','p','me','n']) AS m
            FROM r WHERE kind = 'ring3'
        ), tr AS (
            SELECT host, pid, dev, line_no, unnest(regexp_extract_all(msg, {q(TREE_ITEM)})) AS item
            FROM r WHERE kind = 'tree'
        ), nv AS (
            SELECT host, pid, dev, line_no, regexp_extract(msg, {q(NVLS)}, ['h','ranks']) AS m
            FROM r WHERE kind = 'nvls'
        ), u AS (
            SELECT host, pid, dev, NULL::INTEGER AS own_rank, 'ring' AS kind, TRY_CAST(m.c AS INTEGER) AS channel,
                   TRY_CAST(m.n AS INTEGER) AS n_channels, NULL::INTEGER AS src_rank, NULL::INTEGER AS dst_rank,
                   NULL::INTEGER AS up_rank, regexp_replace(trim(m.o), '\\s+', ' ', 'g') AS peers,
                   NULL AS transport, NULL AS direction, line_no FROM ro
            UNION ALL
            SELECT host, pid, dev, TRY_CAST(m.s AS INTEGER), CASE m.w WHEN 'Ring' THEN 'ring' ELSE 'channel' END,
                   TRY_CAST(m.c AS INTEGER), TRY_CAST(nullif(m.n, '') AS INTEGER), TRY_CAST(m.s AS INTEGER),
                   TRY_CAST(m.d AS INTEGER), NULL, NULL, m.via, nullif(m.dir, ''), line_no FROM lk
            UNION ALL
            SELECT host, pid, dev, TRY_CAST(m.me AS INTEGER), 'ring', TRY_CAST(m.c AS INTEGER), NULL, TRY_CAST(m.p AS INTEGER),
                   TRY_CAST(m.n AS INTEGER), NULL, NULL, NULL, NULL, line_no FROM r3
            UNION ALL
            SELECT host, pid, dev, TRY_CAST(regexp_extract(item, {q(TREE_ITEM)}, 5) AS INTEGER), 'tree',
                   TRY_CAST(regexp_extract(item, {q(TREE_ITEM)}, 1) AS INTEGER), NULL, NULL, NULL,
                   TRY_CAST(regexp_extract(item, {q(TREE_ITEM)}, 6) AS INTEGER),
                   regexp_extract(item, {q(TREE_ITEM)}, 2) || '/' || regexp_extract(item, {q(TREE_ITEM)}, 3) || '/'
                   || regexp_extract(item, {q(TREE_ITEM)}, 4), NULL, NULL, line_no FROM tr
            UNION ALL
            SELECT host, pid, dev, NULL, 'nvls', TRY_CAST(m.h AS INTEGER), NULL, NULL, NULL, NULL,
                   regexp_replace(trim(m.ranks), '\\s+', ' ', 'g'), NULL, NULL, line_no FROM nv
        )
        SELECT u.host, u.pid, u.dev AS device, coalesce(u.own_rank, dr.rank, {rank_sql}) AS rank, u.kind, u.channel,
               u.n_channels, u.src_rank, u.dst_rank, u.up_rank, u.peers, u.transport, u.direction, u.line_no
        FROM u LEFT JOIN devrank dr ON dr.host = u.host AND dr.pid = u.pid AND dr.device = u.dev""")

    # ---- events: NCCL WARN, NCCL error-return traces, PyTorch c10 error / watchdog lines
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nl_events AS
        WITH e AS (
            SELECT host, pid, lrank, kind, loc, msg, line_no, lp FROM _nl_rec WHERE kind IN ('warn', 'errtrace', 'torch')
        ), x AS (
            SELECT *, regexp_extract(msg, {q(TORCH)}, ['sev','when','where','text']) AS t FROM e
        )
        SELECT x.host, x.pid,
               coalesce(TRY_CAST(x.lrank AS INTEGER), cm.rank, {rank_sql}) AS rank,
               CASE WHEN kind = 'warn' THEN 'WARN' WHEN kind = 'errtrace' THEN 'ERROR'
                    WHEN t.sev = 'W' THEN 'WARN'
                    WHEN regexp_matches(t.text, '(?i)watchdog') THEN 'watchdog' ELSE 'ERROR' END AS level,
               CASE WHEN kind = 'torch' THEN 'torch' ELSE 'nccl' END AS origin,
               CASE WHEN kind = 'torch' THEN t."where" WHEN kind = 'errtrace' THEN regexp_extract(msg, '^(\\S+:\\d+)', 1)
                    ELSE x.loc END AS location,
               CASE WHEN kind = 'torch' THEN t.text ELSE msg END AS message,
               TRY_CAST(coalesce(nullif(regexp_extract(msg, 'SeqNum=(\\d+)', 1), ''),
                                 nullif(regexp_extract(msg, 'at work: (\\d+)', 1), '')) AS BIGINT) AS seq,
               nullif(regexp_extract(msg, 'OpType=(\\w+)', 1), '') AS op_type,
               TRY_CAST(nullif(regexp_extract(msg, 'Timeout\\(ms\\)=(\\d+)', 1), '') AS BIGINT) AS timeout_ms,
               TRY_CAST(nullif(regexp_extract(msg, 'last enqueued \\w+ work: (-?\\d+)', 1), '') AS BIGINT) AS last_enqueued,
               TRY_CAST(nullif(regexp_extract(msg, 'last completed \\w+ work: (-?\\d+)', 1), '') AS BIGINT) AS last_completed,
               coalesce(nullif(t."when", ''), nullif(regexp_extract(x.lp, {q(STAMP)}), '')) AS ts,
               x.line_no
        FROM x LEFT JOIN (SELECT host, pid, min(rank) AS rank FROM _nl_comms GROUP BY ALL
                          HAVING count(DISTINCT rank) = 1) cm ON cm.host = x.host AND cm.pid = x.pid""")


def insert_staged(con, job: str, digest: str, st: dict) -> dict:
    """Write the staged _nl_* tables for one file (the caller holds the transaction)."""
    f = st["file"]
    delete_file(con, job, f)
    con.execute("INSERT INTO nccl_comms SELECT ?, ?, host, pid, comm, comm_id, rank, nranks, device, nvml_dev, "
                "bus_id, nnodes, local_ranks, local_rank, init_func, parent, status, line_no FROM _nl_comms", [job, f])
    con.execute("INSERT INTO nccl_colls SELECT ?, ?, * FROM _nl_colls ORDER BY line_no", [job, f])
    con.execute("INSERT INTO nccl_topology SELECT ?, ?, * FROM _nl_topo ORDER BY line_no", [job, f])
    con.execute("INSERT INTO nccl_events SELECT ?, ?, * FROM _nl_events ORDER BY line_no", [job, f])
    for code, n, ex in st["diags"]:
        con.execute("INSERT INTO diagnostics VALUES (?, NULL, ?, ?, ?, ?)", [job, SOURCE, code, n, ex])
    con.execute("""INSERT INTO nccl_log_files (job, path, sha256, nccl_version, n_lines, n_nccl, n_parsed, n_colls,
                   n_warn, hosts, salvaged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [job, f, digest, st["nccl_version"], st["n_lines"], st["n_nccl"], st["n_parsed"], st["n_colls"],
                 st["n_warn"], st["hosts"], st["salvaged"]])
    con.execute("INSERT INTO jobs (job) VALUES (?) ON CONFLICT (job) DO NOTHING", [job])
    return {"nccl_colls": st["n_colls"],
            "nccl_comms": con.execute("SELECT count(*) FROM _nl_comms").fetchone()[0],
            "nccl_topology": con.execute("SELECT count(*) FROM _nl_topo").fetchone()[0],
            "nccl_events": con.execute("SELECT count(*) FROM _nl_events").fetchone()[0]}


def delete_file(con, job: str, f: str) -> None:
    for t in ("nccl_comms", "nccl_colls", "nccl_topology", "nccl_events"):
        con.execute(f"DELETE FROM {t} WHERE job = ? AND file = ?", [job, f])
    con.execute("DELETE FROM nccl_coll_links WHERE job = ? AND file = ?", [job, f])
    con.execute("DELETE FROM nccl_log_files WHERE job = ? AND path = ?", [job, f])
    con.execute("DELETE FROM diagnostics WHERE job = ? AND source = ? AND starts_with(example, ?)",
                [job, SOURCE, f + ":"])


def drop_staged(con) -> None:
    for t in ("_nl_raw", "_nl_l", "_nl_seg", "_nl_p", "_nl_r", "_nl_pair", "_nl_rec", "_nl_init", "_nl_comms",
              "_nl_c", "_nl_t", "_nl_colls", "_nl_topo", "_nl_events", "_nl_k"):
        con.execute(f"DROP TABLE IF EXISTS {t}")


def check_existing(con, path: Path, job: str, digest: str, replace: bool):
    """'unchanged' when this job already holds this exact file; IngestConflict when the path holds another."""
    f = str(Path(path).resolve())
    same = first(con, "SELECT path FROM nccl_log_files WHERE job = ? AND sha256 = ?", [job, digest])
    if same is not None:
        return "unchanged"
    other = first(con, "SELECT sha256 FROM nccl_log_files WHERE job = ? AND path = ?", [job, f])
    if other is not None and not replace:
        raise IngestConflict(path, f"job {job!r} already holds a different version of this log "
                             f"(sha256 {other[0][:12]}); pass --replace to overwrite it")
    return None


def load(con, path, job, rank=None, replace=False, salvage=False):
    from ninefold.ingest.load import LoadResult, sha256_of

    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, None, "no such file")
    digest = sha256_of(path)
    if check_existing(con, path, job, digest, replace) == "unchanged":
        return LoadResult(str(path), job, rank, "unchanged", "already stored (same sha256)")
    _, text = read_text(path)
    try:
        st = stage(con, path, text, rank=rank, salvage=salvage)
        con.execute("BEGIN TRANSACTION")
        try:
            counts = insert_staged(con, job, digest, st)
            con.execute("COMMIT")
        except BaseException as e:
            abort(con, e, "this file's rows")
            raise
    finally:
        drop_staged(con)
    msg = "salvaged (binary lines skipped)" if st["salvaged"] else ""
    return LoadResult(str(path), job, rank, "stored", msg, counts)


# ------------------------------------------------------------------ queries
def desync(con, job: str) -> list[dict]:
    """Launches where the members of one communicator disagree: the same (communicator, opCount, position in
    the group) holds different ops (a desync: e.g. AllReduce on some ranks, AllGather on others) or the same op
    with different counts/datatypes. A communicator is its commId when Init lines give one, else all
    processes whose COLL lines share nranks. Ops with the same opCount are compared only when opCount moves
    (NCCL 2.27 single-node logs print 0 for every launch)."""
    rows = con.execute("""
        WITH c AS (
            SELECT coalesce(comm_id, 'nranks=' || nranks) AS cgroup, host, pid, comm, rank, op, op_count,
                   group_index, count, dtype, line_no, file
            FROM nccl_colls WHERE job = ? AND op_count IS NOT NULL AND op NOT IN ('Send', 'Recv')
        ), moving AS (
            SELECT host, pid, comm FROM c GROUP BY ALL HAVING count(DISTINCT op_count) > 1 OR count(*) = 1
        ), k AS (
            SELECT c.* FROM c JOIN moving USING (host, pid, comm)
        )
        SELECT cgroup, op_count, group_index,
               count(DISTINCT op) > 1 AS op_mismatch,
               list(DISTINCT op ORDER BY op) AS ops,
               list(DISTINCT count ORDER BY count) AS counts,
               list(DISTINCT dtype ORDER BY dtype) AS dtypes,
               list(struct_pack(rank := rank, host := host, pid := pid, op := op, count := count, dtype := dtype,
                                line_no := line_no) ORDER BY host, pid, line_no) AS members
        FROM k GROUP BY cgroup, op_count, group_index
        HAVING count(DISTINCT (host, pid, comm)) > 1
           AND (count(DISTINCT op) > 1 OR count(DISTINCT count) > 1 OR count(DISTINCT dtype) > 1)
        ORDER BY cgroup, op_count, group_index""", [job]).fetchall()
    out = []
    for cg, oc, gi, opm, ops, counts, dtypes, members in rows:
        out.append({"communicator": cg, "op_count": oc, "group_index": gi,
                    "kind": "op_mismatch" if opm else "size_mismatch", "ops": ops, "counts": counts,
                    "dtypes": dtypes, "members": members})
    return out


LOADER = Loader(name="nccl_log", suffixes=(".log", ".txt"), claims=sniff, load=load,
                description="NCCL_DEBUG=INFO text logs (INIT, COLL, TUNING, WARN, PyTorch watchdog lines)")
