"""Per-kernel efficiency: what each kernel achieved against the device's peak, and the time lost to the gap.

Work per kernel comes only from what the trace records (the formulas are in ninefold/analysis/kernel_work.py):

* GEMM and attention: FLOPs from the launching cpu op's ``Input Dims`` / ``Input type`` (the kernel's External
  id, or its launch's correlation): 2·M·N·K for ``aten::mm``/``addmm``/``_scaled_mm``, 2·B·M·N·K for
  ``bmm``/``baddbmm``; flash / memory-efficient / cuDNN attention 2·B·H·pairs·(D_qk + D_v) with pairs = Sq·Sk,
  or Sq·(Sq+1)/2 when ``is_causal`` (recorded in ``Concrete Inputs``) and Sq = Sk; backward 2.5 × forward
  (five matrix products against two, as flash-attention's own benchmarks count it). Against the dense tensor
  peak of the math dtype: bf16/fp16 ``peak_bf16``, fp8 ``peak_fp8``, float32 ``peak_tf32`` (the fastest a
  float32 product can run; a plain-FP32 kernel therefore shows the TF32 speed-up it leaves).
* Memory-bound ops (elementwise, norms, softmax, copies, reductions): bytes = the tensor inputs read plus the
  output written (in-place: the first input; out-of-place: the inputs' broadcast shape in the first input's
  dtype; reductions: output not counted, so achieved is a lower bound), against ``hbm_bw``. Copies and memsets
  use their own recorded bytes: host<->device against ``pcie_beta``, device-to-device (read + write) and
  memset against ``hbm_bw``, peer-to-peer against ``nvlink_beta``.
* Communication kernels: algorithm bandwidth algbw = S / t and bus bandwidth busbw = algbw × factor as
  nccl-tests defines them (S the larger of the input and output buffer; factor 2(n−1)/n all-reduce, (n−1)/n
  all-gather, reduce-scatter and all-to-all, 1 broadcast, reduce and send/recv), against the per-direction link
  bandwidth: NVLink when every member of the group is on one host (or, hosts not recorded, the group fits a
  node, said so in the note), else the network.

An op that launched several kernels shares its work among them by their time. Where the work is not known the
row says why in ``note`` and leaves achieved/efficiency/lost empty: nothing is guessed. Ideal = work / peak,
lost_ns = time_ns − ideal, efficiency = achieved / peak = ideal / time. Rows: one per (rank, kernel name, how
the work was counted, note), stored in ``kernel_efficiency``. A communication kernel's time includes waiting for
the group's last member; once the job is attributed, ``wait_ns`` says how much of it that was (the straggler
ledger's share, from collective_matches), so a low busbw from a late peer is told apart from a slow transfer.
"""
from __future__ import annotations

import json
import tomllib

from ninefold.analysis.classify import classify_kernel
from ninefold.analysis.cost_model.hardware import PRESETS_ORDER, PRESET_FILE, hardware, preset_for_device
from ninefold.analysis.kernel_work import ATTENTION_OPS, GEMM_OPS, attention_flops, bus_factor, gemm_flops, memory_bytes
from ninefold.analysis.process_groups import canonical

DDL = """job VARCHAR, rank INTEGER, kernel VARCHAR, kclass VARCHAR, calls BIGINT, time_ns BIGINT, work DOUBLE,
         achieved DOUBLE, peak DOUBLE, unit VARCHAR, efficiency DOUBLE, lost_ns BIGINT, algbw DOUBLE,
         wait_ns BIGINT, device VARCHAR, basis VARCHAR, note VARCHAR"""
COLUMNS = ("job", "rank", "kernel", "kclass", "calls", "time_ns", "work", "achieved", "peak", "unit", "efficiency",
           "lost_ns", "algbw", "wait_ns", "device", "basis", "note")
FLOPS, BYTES, BUSBW = "FLOP/s", "B/s", "B/s busbw"
RATE_SCALE = {FLOPS: (1e12, "TFLOP/s"), BYTES: (1e9, "GB/s"), BUSBW: (1e9, "GB/s bus")}


def human(value, unit) -> str:
    """A rate in its unit's display scale (RATE_SCALE: TFLOP/s, GB/s), one decimal; '-' when unknown."""
    if value is None or unit is None:
        return "-"
    return f"{value / RATE_SCALE[unit][0]:.1f}"


class EfficiencyError(ValueError):
    """A job or device that cannot be evaluated (missing job, unknown preset)."""


# ---------------------------------------------------------------- the job
def _peaks(preset: str) -> dict:
    hw = hardware(preset)
    with open(PRESET_FILE, "rb") as fh:
        raw = tomllib.load(fh).get(preset, {})
    return {"hw": hw, "bf16": hw.peak_bf16, "fp16": hw.peak_bf16, "fp8": hw.peak("fp8"),
            "fp32": raw.get("peak_tf32")}


def _dtype_peak(peaks: dict | None, kind: str):
    """(peak FLOP/s, why there is none) of a math dtype on the device; (None, None) when the device is unknown."""
    if peaks is None:
        return None, None
    p = peaks.get(kind)
    if p is None:
        return None, f"no {kind} peak in the device preset"
    return float(p), None


def resolve_devices(con, job: str, device: str | None = None) -> dict:
    """Per rank: {"preset": name or None, "from": the trace's device name or '--device'}."""
    ranks = con.execute("SELECT rank, device_name FROM traces WHERE job = ? ORDER BY rank", [job]).fetchall()
    if not ranks:
        raise EfficiencyError(f"no job {job!r} in the store")
    if device is not None:
        try:
            hw = hardware(device)
        except KeyError as e:
            raise EfficiencyError(str(e.args[0])) from None
        return {r: {"preset": hw.preset, "from": "--device"} for r, _ in ranks}
    return {r: {"preset": preset_for_device(n), "from": n} for r, n in ranks}


def device_line(devs: dict) -> str:
    """One line saying which preset each rank was measured against, or that the device is unknown."""
    by: dict = {}
    for r, d in devs.items():
        by.setdefault((d["preset"], d["from"]), []).append(r)
    parts = []
    for (p, src), rs in sorted(by.items(), key=lambda kv: kv[1][0]):
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs[0]}-{rs[-1]}" if rs == list(
            range(rs[0], rs[-1] + 1)) else f"ranks {','.join(map(str, rs))}"
        if p is None:
            parts.append(f"{who}: device {src!r} matches no preset ({', '.join(PRESETS_ORDER)}); pass --device "
                         "PRESET for efficiencies")
        else:
            parts.append(f"{who}: {p}" + (f" (from {src!r})" if src != "--device" else " (--device)"))
    return "device: " + "; ".join(parts)


# the launch call of every GPU op (by correlation): its thread and time, and the External id it carries
_RT = """rt AS (
    SELECT rank, correlation, any_value(external_id) AS x, any_value(pid) AS pid, any_value(tid) AS tid,
           min(start_ns) AS t
    FROM host_ops WHERE job = $job AND cat IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
    GROUP BY ALL
), byid AS (
    SELECT rank, external_id AS x, arg_max(name, depth) AS op_name,
           arg_max(CAST(json_extract(args, '$."Input Dims"') AS VARCHAR), depth) AS dims,
           arg_max(CAST(json_extract(args, '$."Input type"') AS VARCHAR), depth) AS types,
           arg_max(CAST(json_extract(args, '$."Concrete Inputs"') AS VARCHAR), depth) AS concrete
    FROM host_ops WHERE job = $job AND cat = 'cpu_op' AND external_id IS NOT NULL GROUP BY ALL
), g AS (
    SELECT g.rank, g.kind, g.name, g.start_ns, g.end_ns - g.start_ns AS dur, g.bytes, g.copy_kind, g.correlation,
           coalesce(g.external_id, rt.x) AS x, rt.pid, rt.tid, rt.t
    FROM gpu_ops g LEFT JOIN rt ON rt.rank = g.rank AND rt.correlation = g.correlation
    WHERE g.job = $job AND g.kind IN ('kernel', 'memcpy', 'memset') AND g.name IS NOT NULL
)"""

# kernel launches that no cpu op claims by External id (Kineto of 2022 wrote the correlation there)
UNCLAIMED_SQL = f"""WITH {_RT}
SELECT DISTINCT g.rank, g.pid, g.tid, g.t, g.correlation FROM g LEFT JOIN byid ON byid.rank = g.rank AND byid.x = g.x
WHERE g.kind = 'kernel' AND byid.op_name IS NULL AND g.t IS NOT NULL AND g.correlation IS NOT NULL
ORDER BY g.rank, g.pid, g.tid, g.t"""

THREAD_OPS_SQL = """
SELECT h.rank, h.pid, h.tid, h.start_ns, h.end_ns, h.name, CAST(json_extract(h.args, '$."Input Dims"') AS VARCHAR),
       CAST(json_extract(h.args, '$."Input type"') AS VARCHAR), CAST(json_extract(h.args, '$."Concrete Inputs"') AS VARCHAR)
FROM host_ops h SEMI JOIN (SELECT DISTINCT rank, pid, tid FROM _eff_launch) l
     ON l.rank = h.rank AND l.pid IS NOT DISTINCT FROM h.pid AND l.tid IS NOT DISTINCT FROM h.tid
WHERE h.job = $job AND h.cat = 'cpu_op'
ORDER BY h.rank, h.pid, h.tid, h.start_ns, h.end_ns DESC"""

# with the job attributed: per communication kernel, the time it waited for the group's last member to arrive
WAITS_SQL = """
    SELECT rank, start_ns, end_ns, max(greatest(last_arrival_ns - arrival_ns, 0)) AS wait FROM collective_matches
    WHERE job = $job AND matched GROUP BY ALL"""
NO_WAITS_SQL = ("SELECT NULL::INTEGER AS rank, NULL::BIGINT AS start_ns, NULL::BIGINT AS end_ns, NULL::BIGINT AS wait "
                "WHERE false")

KERNELS_SQL = """WITH {rt}, gl AS (
    SELECT g.*, coalesce(byid.op_name, e.op_name) AS op_name, coalesce(byid.dims, e.dims) AS dims,
           coalesce(byid.types, e.types) AS types, coalesce(byid.concrete, e.concrete) AS concrete,
           CASE WHEN byid.op_name IS NOT NULL THEN 'x' || g.x WHEN e.op_name IS NOT NULL THEN e.op_key END AS op_key
    FROM g LEFT JOIN byid ON byid.rank = g.rank AND byid.x = g.x
           LEFT JOIN _eff_encl e ON e.rank = g.rank AND e.correlation = g.correlation AND byid.op_name IS NULL
               AND g.kind = 'kernel'
), gk AS (
    SELECT *, CASE WHEN kind = 'kernel' AND op_key IS NOT NULL
                   THEN sum(dur) FILTER (WHERE kind = 'kernel') OVER (PARTITION BY rank, op_key) END AS op_ns,
              CASE WHEN kind = 'kernel' AND op_key IS NOT NULL
                   THEN count(*) FILTER (WHERE kind = 'kernel') OVER (PARTITION BY rank, op_key) END AS op_n
    FROM gl
), c AS (
    SELECT rank, kernel_name, start_ns, any_value(coll) AS coll, max(in_nelems) AS in_n, max(out_nelems) AS out_n,
           max(bytes) AS cbytes, max(group_size) AS group_size, any_value(pg_ranks) AS pg_ranks
    FROM collectives WHERE job = $job AND kernel_name IS NOT NULL GROUP BY ALL
), cm AS ({waits}
)
SELECT gk.rank, gk.kind, gk.name, gk.copy_kind, gk.x IS NOT NULL OR gk.t IS NOT NULL AS linked, gk.op_name,
       gk.dims, gk.types, gk.concrete, max(gk.op_n) AS op_n, c.coll, c.in_n, c.out_n, c.cbytes, c.group_size,
       c.pg_ranks, count(*) AS calls, sum(gk.dur) AS ns,
       sum(CASE WHEN gk.op_ns > 0 THEN gk.dur / gk.op_ns ELSE 1.0 END) AS share, sum(gk.bytes) AS bytes,
       count(gk.bytes) AS n_bytes, sum(CASE WHEN cm.wait IS NOT NULL THEN least(cm.wait, gk.dur) END) AS wait_ns
FROM gk LEFT JOIN c ON c.rank = gk.rank AND c.kernel_name = gk.name AND c.start_ns = gk.start_ns
        LEFT JOIN cm ON cm.rank = gk.rank AND cm.start_ns = gk.start_ns AND cm.end_ns = gk.start_ns + gk.dur
                     AND gk.kind = 'kernel'
GROUP BY gk.rank, gk.kind, gk.name, gk.copy_kind, linked, gk.op_name, gk.dims, gk.types, gk.concrete, c.coll,
         c.in_n, c.out_n, c.cbytes, c.group_size, c.pg_ranks
"""

_ENCL_SCHEMA = (("rank", "int32"), ("correlation", "int64"), ("op_name", "string"), ("dims", "string"),
                ("types", "string"), ("concrete", "string"), ("op_key", "string"))


def _enclosing_ops(con, job: str):
    """Arrow table (rank, correlation) -> the innermost cpu op on the launching thread around the launch call,
    for the kernel launches no cpu op claims by External id. One sweep per thread: ops in start order on a
    stack (they nest), launches in time order."""
    import pyarrow as pa

    launches = con.execute(UNCLAIMED_SQL, {"job": job}).fetchall()
    out: dict = {k: [] for k, _ in _ENCL_SCHEMA}
    if launches:
        con.register("_eff_launch", pa.table({"rank": [r[0] for r in launches], "pid": [r[1] for r in launches],
                                              "tid": [r[2] for r in launches]}))
        try:
            ops = con.execute(THREAD_OPS_SQL, {"job": job}).fetchall()
        finally:
            con.unregister("_eff_launch")
        by_thread: dict = {}
        for o in ops:
            by_thread.setdefault(o[:3], []).append(o)
        li = 0
        while li < len(launches):
            thread = launches[li][:3]
            tops, stack, oi = by_thread.get(thread, []), [], 0
            while li < len(launches) and launches[li][:3] == thread:
                t = launches[li][3]
                while oi < len(tops) and tops[oi][3] <= t:
                    while stack and stack[-1][4] <= tops[oi][3]:
                        stack.pop()
                    stack.append(tops[oi])
                    oi += 1
                while stack and stack[-1][4] <= t:
                    stack.pop()
                if stack:
                    o = stack[-1]
                    for k, v in zip(("rank", "correlation", "op_name", "dims", "types", "concrete", "op_key"),
                                    (o[0], launches[li][4], o[5], o[6], o[7], o[8], f"{o[1]}:{o[2]}:{o[3]}")):
                        out[k].append(v)
                li += 1
    return pa.table({k: pa.array(out[k], getattr(pa, t)()) for k, t in _ENCL_SCHEMA})


def _loads(s):
    try:
        v = json.loads(s) if s else None
    except ValueError:
        return None
    return v if isinstance(v, list) else None


def _op_work(op_name, dims_s, types_s, concrete_s, cache):
    """(work per op, unit, basis, dtype kind or None) or a str saying why there is none."""
    key = (op_name, dims_s, types_s, concrete_s)
    if key in cache:
        return cache[key]
    dims, types = _loads(dims_s), _loads(types_s)
    out: tuple | str
    if not dims or not types or not any(isinstance(d, list) and d for d in dims):
        out = f"no Input Dims on the launching op {op_name}"
    else:
        try:
            if op_name in GEMM_OPS:
                f, kind = gemm_flops(op_name, dims, types)
                out = (f, FLOPS, f"{op_name} {'2BMNK' if GEMM_OPS[op_name][2] else '2MNK'} {kind}", kind)
            elif op_name in ATTENTION_OPS:
                f, kind, causal = attention_flops(op_name, dims, types, _loads(concrete_s))
                how = ("bwd 2.5x" if ATTENTION_OPS[op_name][6] > 1 else "fwd") + (" causal" if causal else "")
                out = (f, FLOPS, f"{op_name} {how} {kind}", kind)
            elif op_name.startswith("aten::"):
                b, how = memory_bytes(op_name, dims, types)
                out = (b, BYTES, f"{op_name} {how}", None)
            else:
                out = f"no FLOP or byte count for {op_name}"
        except ValueError as e:
            out = str(e)
    cache[key] = out
    return out


def _hosts(con, job):
    return dict(con.execute("SELECT rank, host_name FROM traces WHERE job = ?", [job]).fetchall())


def _link(hw, members, n, hosts):
    """(link level, note) for a collective over MEMBERS (global ranks; None when not recorded) of size N."""
    if members:
        hs = [hosts.get(m) for m in members]
        if all(hs):
            return ("nvlink", None) if len(set(hs)) == 1 else ("ib", f"group spans {len(set(hs))} hosts")
    if n <= hw.gpus_per_node:
        return "nvlink", f"hosts of the group not all recorded: taken as one node ({n} <= {hw.gpus_per_node} GPUs)"
    return "ib", f"hosts of the group not all recorded: {n} ranks > {hw.gpus_per_node} GPUs per node"


def _members(pg_ranks):
    try:
        v = json.loads(pg_ranks) if pg_ranks else None
    except ValueError:
        return None
    return [int(x) for x in v] if isinstance(v, list) and all(isinstance(x, int) for x in v) and v else None


def _row_work(r, peaks, hosts, cache):
    """(work, unit, peak, basis, note, algbw-bytes) of one SQL group; work None when unknown."""
    fam, kclass = classify_kernel(r["name"])
    hw = peaks["hw"] if peaks else None
    if r["kind"] in ("memcpy", "memset"):
        if r["n_bytes"] < r["calls"]:
            return None, None, None, None, f"{r['kind']} without recorded bytes", None
        ck = r["copy_kind"] or ""
        if r["kind"] == "memset":
            return float(r["bytes"]), BYTES, hw and hw.hbm_bw, "memset bytes written vs HBM", None, None
        if ck in ("HtoD", "DtoH"):
            return float(r["bytes"]), BYTES, hw and hw.pcie_beta, f"{ck} bytes vs PCIe", None, None
        if ck == "DtoD":
            return 2.0 * r["bytes"], BYTES, hw and hw.hbm_bw, "DtoD bytes read + written vs HBM", None, None
        if ck == "PtoP":
            return float(r["bytes"]), BYTES, hw and hw.nvlink_beta, "PtoP bytes vs NVLink", None, None
        return None, None, None, None, f"copy kind {ck or 'unknown'}: no peak to compare with", None
    if fam == "comm":
        if r["coll"] is None:
            return None, None, None, None, "no collective record (record_param_comms) for this kernel", None
        n = r["group_size"] or (len(_members(r["pg_ranks"]) or []) or None)
        f = bus_factor(r["coll"], n) if n else None
        if not r["cbytes"] or not r["in_n"]:
            return None, None, None, None, f"{r['coll']}: message size or dtype not recorded", None
        if n is None or f is None:
            return None, None, None, None, f"{r['coll']}: group size or bus factor unknown", None
        if n < 2 and canonical(r["coll"]) != "sendrecv":
            return None, None, None, None, f"{r['coll']} over a group of {n}: nothing moves", None
        size = max(r["in_n"], r["out_n"] or 0) * (r["cbytes"] / r["in_n"])  # nccl-tests' size: the larger buffer
        peak, note = None, None
        if hw:
            level, note = _link(hw, _members(r["pg_ranks"]), n, hosts)
            peak = hw.link(level).beta
            basis = f"{canonical(r['coll']) or r['coll']} n={n} busbw x{f:.3g} vs {level}"
        else:
            basis = f"{canonical(r['coll']) or r['coll']} n={n} busbw x{f:.3g}"
        return size * f * r["calls"], BUSBW, peak, basis, note, size * r["calls"]
    if not r["linked"]:
        return None, None, None, None, "no launch in the trace (no External id, no runtime call with its correlation)", None
    if r["op_name"] is None:
        return None, None, None, None, "no cpu op around the launch (no aten op to read shapes from)", None
    w = _op_work(r["op_name"], r["dims"], r["types"], r["concrete"], cache)
    if isinstance(w, str):
        return None, None, None, None, w, None
    per_op, unit, basis, kind = w
    note = f"{r['op_name']} launched {r['op_n']} kernels: its work shared by their time" if r["op_n"] > 1 else None
    if unit == FLOPS:
        peak, why = _dtype_peak(peaks, kind)
        if why:
            return per_op * r["share"], unit, None, basis, why, None
    else:
        peak = hw and hw.hbm_bw
    return per_op * r["share"], unit, peak, basis, note, None


def compute_efficiency(con, job: str, device: str | None = None) -> tuple[list[dict], dict]:
    """Rows (see the module doc), ordered by lost time, and the per-rank devices (resolve_devices)."""
    devs = resolve_devices(con, job, device)
    peaks_of = {p: _peaks(p) for p in {d["preset"] for d in devs.values()} if p}
    hosts = _hosts(con, job)
    con.register("_eff_encl", _enclosing_ops(con, job))
    try:
        have = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        sql = KERNELS_SQL.format(rt=_RT, waits=WAITS_SQL if "collective_matches" in have else NO_WAITS_SQL)
        cur = con.execute(sql, {"job": job})
        cols = [d[0] for d in cur.description]
        fetched = cur.fetchall()
    finally:
        con.unregister("_eff_encl")
    agg: dict = {}
    cache: dict = {}
    for t in fetched:
        r = dict(zip(cols, t))
        dev = devs.get(r["rank"], {}).get("preset")
        peaks = peaks_of.get(dev)
        work, unit, peak, basis, note, alg = _row_work(r, peaks, hosts, cache)
        if dev is None and work is not None:
            note = note or "device matches no preset: pass --device"
        kclass = r["kind"] if r["kind"] != "kernel" else classify_kernel(r["name"])[1]
        key = (r["rank"], r["name"], kclass, unit, peak, basis, note)
        a = agg.setdefault(key, {"calls": 0, "time_ns": 0, "work": None if work is None else 0.0,
                                 "alg": None if alg is None else 0.0, "wait": None, "device": dev})
        a["calls"] += int(r["calls"])
        a["time_ns"] += int(r["ns"])
        if work is not None:
            a["work"] += work
        if alg is not None:
            a["alg"] += alg
        if r["wait_ns"] is not None:
            a["wait"] = (a["wait"] or 0) + int(r["wait_ns"])
    rows = []
    for (rank, name, kclass, unit, peak, basis, note), a in agg.items():
        secs = a["time_ns"] / 1e9
        achieved = a["work"] / secs if a["work"] is not None and secs > 0 else None
        eff = achieved / peak if achieved is not None and peak else None
        lost = int(round(a["time_ns"] - a["work"] / peak * 1e9)) if a["work"] is not None and peak else None
        if a["work"] is not None and secs <= 0:
            note = note or "zero duration"
        rows.append({"job": job, "rank": rank, "kernel": name, "kclass": kclass, "calls": a["calls"],
                     "time_ns": a["time_ns"], "work": a["work"], "achieved": achieved, "peak": peak, "unit": unit,
                     "efficiency": eff, "lost_ns": lost,
                     "algbw": a["alg"] / secs if a["alg"] is not None and secs > 0 else None,
                     "wait_ns": a["wait"], "device": a["device"], "basis": basis, "note": note})
    rows.sort(key=lambda x: (x["lost_ns"] is None, -(x["lost_ns"] or 0), -x["time_ns"], x["rank"], x["kernel"]))
    return rows, devs


UNKNOWN_WORK = "work not known"


def by_kernel(rows: list[dict]) -> dict:
    """Rows of one job (per rank and kernel, compute_efficiency's) summed over the ranks per kernel name and unit:
    {"kernels": [{kernel, kclass, unit, ranks, calls, time_ns, ideal_ns, lost_ns, work, peak, efficiency
    (ideal / time), achieved}] largest lost time first, "missing": [(reason, calls, time_ns)] of the rows whose
    lost time is unknown, largest first, "unknown_kernels": how many kernel names those are, and the totals
    total_ns, known_ns, lost_ns}."""
    by: dict = {}
    missing: dict = {}
    unknown = set()
    for r in rows:
        if r["lost_ns"] is None:
            m = missing.setdefault(r["note"] or UNKNOWN_WORK, [0, 0])
            m[0] += r["calls"]
            m[1] += r["time_ns"]
            unknown.add(r["kernel"])
            continue
        k = by.setdefault((r["kernel"], r["unit"]), {"kernel": r["kernel"], "kclass": r["kclass"], "unit": r["unit"],
                                                     "ranks": set(), "calls": 0, "time_ns": 0, "ideal_ns": 0.0,
                                                     "lost_ns": 0, "work": 0.0, "peak": r["peak"]})
        k["ranks"].add(r["rank"])
        k["calls"] += r["calls"]
        k["time_ns"] += r["time_ns"]
        k["ideal_ns"] += r["work"] / r["peak"] * 1e9
        k["lost_ns"] += r["lost_ns"]
        k["work"] += r["work"]
    kernels = []
    for k in by.values():
        k["ranks"] = len(k["ranks"])
        k["efficiency"] = k["ideal_ns"] / k["time_ns"] if k["time_ns"] > 0 else None
        k["achieved"] = k["work"] / (k["time_ns"] / 1e9) if k["time_ns"] > 0 else None
        kernels.append(k)
    kernels.sort(key=lambda k: (-k["lost_ns"], -k["time_ns"], k["kernel"]))
    miss = sorted(((why, c, ns) for why, (c, ns) in missing.items()), key=lambda x: (-x[2], x[0]))
    return {"kernels": kernels, "missing": miss, "unknown_kernels": len(unknown),
            "total_ns": sum(r["time_ns"] for r in rows), "known_ns": sum(k["time_ns"] for k in kernels),
            "lost_ns": sum(k["lost_ns"] for k in kernels)}


def store_efficiency(con, job: str, rows: list[dict]) -> None:
    """Replace JOB's rows of ``kernel_efficiency`` (one transaction)."""
    import pyarrow as pa

    con.execute(f"CREATE TABLE IF NOT EXISTS kernel_efficiency ({DDL})")
    # columns added since a store was first written
    con.execute("ALTER TABLE kernel_efficiency ADD COLUMN IF NOT EXISTS wait_ns BIGINT")
    tbl = pa.table({c: [r[c] for r in rows] for c in COLUMNS}, schema=pa.schema([
        ("job", pa.string()), ("rank", pa.int32()), ("kernel", pa.string()), ("kclass", pa.string()),
        ("calls", pa.int64()), ("time_ns", pa.int64()), ("work", pa.float64()), ("achieved", pa.float64()),
        ("peak", pa.float64()), ("unit", pa.string()), ("efficiency", pa.float64()), ("lost_ns", pa.int64()),
        ("algbw", pa.float64()), ("wait_ns", pa.int64()), ("device", pa.string()), ("basis", pa.string()), ("note", pa.string())]))
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM kernel_efficiency WHERE job = ?", [job])
        con.register("_ke", tbl)
        con.execute(f"INSERT INTO kernel_efficiency ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM _ke")
        con.unregister("_ke")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def stored_rows(con, job: str) -> list[dict] | None:
    """JOB's ``kernel_efficiency`` rows as store_efficiency wrote them (the columns a store of an older version
    has), or None when there are none."""
    have = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'kernel_efficiency'"
                                      ).fetchall()}
    if not have:
        return None
    cols = [c for c in COLUMNS if c in have]
    cur = con.execute(f"SELECT {', '.join(cols)} FROM kernel_efficiency WHERE job = ?", [job])
    return [dict(zip(cols, t)) for t in cur.fetchall()] or None


def kernel_efficiency(con, job: str, device: str | None = None) -> tuple[list[dict], dict]:
    """Compute JOB's per-kernel efficiency rows and store them; (rows by lost time, per-rank devices)."""
    rows, devs = compute_efficiency(con, job, device)
    store_efficiency(con, job, rows)
    return rows, devs
