"""Every Kineto trace in the shared corpus ingests, with counts computed independently from the JSON."""
import gzip
import json
import re
from decimal import Decimal

import pytest

from conftest import SHARED_TRACES, needs_shared
from ninefold.ingest.load import load_kineto
from ninefold.store.errors import TraceFormatError

pytestmark = needs_shared


def _all_json():
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(p for p in SHARED_TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")))


def _load(path):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.loads(f.read(), parse_float=Decimal)


KERNEL_CATS = {"kernel", "mtia_ccp_events"}
MEMCPY_CATS = {"gpu_memcpy", "memcpy"}
MEMSET_CATS = {"gpu_memset", "memset"}


def _expected(doc):
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    cat = lambda e: str(e.get("cat") or "").lower()
    steps = {int(m.group(1)) for e in ev if cat(e) in ("user_annotation", "cpu_op", "operator")
             for m in [re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name")))] if m}
    return {
        "kernel": sum(cat(e) in KERNEL_CATS for e in ev),
        "memcpy": sum(cat(e) in MEMCPY_CATS for e in ev),
        "memset": sum(cat(e) in MEMSET_CATS for e in ev),
        "steps": len(steps),
    }


@pytest.mark.parametrize("path", _all_json(), ids=lambda p: str(p.relative_to(SHARED_TRACES)))
def test_every_shared_json_ingests_or_fails_clearly(db, path):
    try:
        doc = _load(path)
    except ValueError:
        doc = None
    is_kineto = isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    if not is_kineto:
        with pytest.raises(TraceFormatError) as ei:
            load_kineto(db, path, "job", rank=0)
        assert str(path) in str(ei.value) and "\n" not in str(ei.value)
        assert db.execute("SELECT count(*) FROM gpu_ops").fetchone()[0] == 0
        return
    r = load_kineto(db, path, "job", rank=0)
    assert r.status == "stored"
    exp = _expected(doc)
    got = {k: r.counts[k] for k in exp}
    assert got == exp
    # exact ns: the earliest kernel start equals the decimal computation from the JSON
    base = doc.get("baseTimeNanoseconds") or 0
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    if kernels:
        want = min(int((Decimal(str(e["ts"])) * 1000).to_integral_value()) for e in kernels) + base
        have = db.execute("SELECT min(start_ns) FROM gpu_ops WHERE kind = 'kernel'").fetchone()[0]
        assert have == want
