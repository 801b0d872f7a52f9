"""Allocator events (profile_memory=True) land in memory_events, exactly as the JSON has them."""
import gzip
import json

from conftest import SHARED_TRACES, needs_shared
from ninefold.ingest.load import load_kineto

TRACE = "hta/df_index_resolver/df_index_resolver.json.gz"


@needs_shared
def test_memory_events_match_the_json(db):
    path = SHARED_TRACES / TRACE
    doc = json.load(gzip.open(path))
    mem = [e for e in doc["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]"]
    assert mem, "the trace was recorded with profile_memory"
    r = load_kineto(db, path, "m")
    assert r.status == "stored"
    assert r.counts["memory_events"] == len(mem)
    got = db.execute("""SELECT count(*), max(total_allocated), sum(bytes), min(ts_ns), count(DISTINCT device_id)
                        FROM memory_events WHERE job = 'm'""").fetchone()
    base = doc.get("baseTimeNanoseconds", 0)
    want_min_ts = min(round(e["ts"] * 1000) for e in mem) + (base if isinstance(base, int) else 0)
    assert got == (len(mem), max(e["args"]["Total Allocated"] for e in mem),
                   sum(e["args"]["Bytes"] for e in mem), want_min_ts,
                   len({e["args"]["Device Id"] for e in mem}))


def test_memory_events_replaced_with_the_rank(db, tmp_path):
    p = tmp_path / "rank-0.json"
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5},
          {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 11.5,
           "args": {"Device Type": 1, "Device Id": 0, "Addr": 1, "Bytes": 512, "Total Allocated": 512,
                    "Total Reserved": 2097152}}]
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": ev}))
    assert load_kineto(db, p, "j").status == "stored"
    ev[1]["args"]["Bytes"] = 1024
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": ev}))
    assert load_kineto(db, p, "j", replace=True).status == "stored"
    assert db.execute("SELECT ts_ns, bytes FROM memory_events").fetchall() == [(11_500, 1024)]
