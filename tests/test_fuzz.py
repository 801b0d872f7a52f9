"""Seeded mutation fuzzing of ingest: Kineto JSON and .json.gz, Flight Recorder JSON, NCCL logs, nsys SQLite; the
text of an nsys export (surrogates, NULs, bytes that are not UTF-8); JSON nesting depth in every JSON reader
(Kineto, Flight Recorder, the side-file check of a directory scan).

Every mutated input either lands or fails with one line naming the file; a failure stores nothing; a traceback
is a defect; the store still opens and the jobs already in it are unchanged. The gate draws a fixed 1,000+
inputs; HYPOTHESIS_PROFILE=explore draws 10,000+ fresh ones (a new seed each run).
"""
import gzip
import os
import random
import shutil
import sqlite3
import sys
import time

import pytest

from ninefold.ingest.load import ingest_paths
from sample_traces.alltoall2023 import generate_a2a
from sample_traces.flight_recorder import generate as generate_fr
from test_nccl_log import _synthetic_log
from test_nsys_ingest import _synthetic as _synthetic_nsys

EXPLORE = os.environ.get("HYPOTHESIS_PROFILE") == "explore"
SCALE = 10 if EXPLORE else 1
TABLES = ("traces", "gpu_ops", "host_ops", "collectives", "steps", "flows", "memory_events", "fr_dumps",
          "fr_entries", "nccl_log_files", "nccl_colls", "nccl_comms")


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(7)
        i = rng.randrange(max(len(b), 1))
        if op == 0 and b:                                  # flip a byte
            b[i] = rng.randrange(256)
        elif op == 1:                                      # truncate
            del b[i:]
        elif op == 2:                                      # delete a slice
            del b[i:i + rng.randrange(1, 64)]
        elif op == 3:                                      # duplicate a slice
            b[i:i] = b[i:i + rng.randrange(1, 256)]
        elif op == 4:                                      # junk
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        elif op == 5:                                      # a number no field can hold
            b[i:i] = rng.choice((b"9" * 40, b"-1", b"1e400", b"null", b"\"x\"", b"[]", b"{}"))
        else:                                              # a lone surrogate / NUL escape in a string
            b[i:i] = rng.choice((b"\\udcff", b"\\u0000", b"\\ud800\\u0041"))
    return bytes(b)


def _counts(db, job):
    return {t: db.execute(f"SELECT count(*) FROM {t} WHERE job = ?", [job]).fetchone()[0] for t in TABLES}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzbase")
    generate_a2a(d / "k", ranks=1, steps=1, seed=4)
    kin = (d / "k" / "rank-0.json").read_bytes()
    generate_fr(d / "fr", world=2, tp=2, hang_ranks=())
    fr = sorted((d / "fr" / "json").glob("*.json"))[0].read_bytes()
    log = _synthetic_log(d / "r0.log", 0, ops=[("AllReduce", 1024, 7)] * 3).read_bytes()
    _synthetic_nsys(d / "n.sqlite")
    return {"rank-0.json": kin, "rank-0.json.gz": gzip.compress(kin, 1), "rank-0.fr.json": fr,
            "rank-0.nccl.log": log, "n.sqlite": (d / "n.sqlite").read_bytes()}


@pytest.mark.parametrize("kind, n", [("rank-0.json", 400), ("rank-0.json.gz", 150), ("rank-0.fr.json", 250),
                                     ("rank-0.nccl.log", 200), ("n.sqlite", 60)])
def test_mutated_inputs_land_whole_or_fail_in_one_line(db, tmp_path, bases, kind, n):
    seed = int(time.time()) if EXPLORE else 20261204
    rng = random.Random(f"{seed}-{kind}")
    base = bases[kind]
    keep = tmp_path / f"base-{kind}"
    keep.write_bytes(base)
    rank = None if kind == "n.sqlite" else 0  # the nsys export holds two processes: two ranks
    res = ingest_paths(db, [keep], job="base", rank=rank)
    assert res and all(r.status == "stored" for r in res), [r.message for r in res]
    before = _counts(db, "base")
    for i in range(n * SCALE):
        data = base
        if kind.endswith(".gz") and rng.random() < 0.5:    # mutate inside the stream, or the stream itself
            data = gzip.compress(_mutate(gzip.decompress(base), rng), 1)
        elif kind == "n.sqlite":
            data = _mutate(base, rng)
        else:
            data = _mutate(base, rng)
        p = tmp_path / f"m{i}" / kind
        p.parent.mkdir()
        p.write_bytes(data)
        job = f"m{i}"
        try:
            res = ingest_paths(db, [p], job=job, rank=rank)
        except Exception as e:  # a traceback: the defect this test exists to find
            pytest.fail(f"{kind} mutation {i} (seed {seed}): {type(e).__name__}: {e}")
        for r in res:
            if r.status == "failed":
                assert "\n" not in r.message and str(p.parent) in r.message, (i, r.message)
                assert not any(_counts(db, job).values()), (i, r.message, _counts(db, job))
            else:
                assert r.status in ("stored", "skipped", "unchanged"), (i, r.status, r.message)
        p.unlink()
    assert _counts(db, "base") == before


def _check(db, p, job, rank, kind, i, seed):
    """Ingest P as JOB: lands, or fails in one line naming its folder and storing nothing; never a traceback."""
    try:
        res = ingest_paths(db, [p], job=job, rank=rank)
    except Exception as e:  # a traceback: the defect this test exists to find
        pytest.fail(f"{kind} mutation {i} (seed {seed}): {type(e).__name__}: {e}")
    for r in res:
        if r.status == "failed":
            assert "\n" not in r.message and str(p.parent if p.is_file() else p) in r.message, (i, r.message)
            assert not any(_counts(db, job).values()), (i, r.message, _counts(db, job))
        else:
            assert r.status in ("stored", "skipped", "unchanged"), (i, r.status, r.message)
    return res


def _store_base(db, tmp_path, name, data, rank):
    keep = tmp_path / f"base-{name}"
    keep.write_bytes(data)
    res = ingest_paths(db, [keep], job="base", rank=rank)
    assert res and all(r.status == "stored" for r in res), [r.message for r in res]
    return _counts(db, "base")


# what nsys text may hold: a lone surrogate as CESU-8, a cut character, stray continuation bytes, NUL, overlong
BAD_TEXT = (b"\xed\xa0\x80", b"\xed\xb3\xbf", b"\xe2\x82", b"\x80\x80", b"\x00", b"\xc0\xaf", b"\xff",
            b"\xf4\x90\x80\x80")


def test_nsys_text_mutations_land_or_fail_in_one_line(db, tmp_path, bases):
    seed = int(time.time()) if EXPLORE else 20261208
    rng = random.Random(seed)
    before = _store_base(db, tmp_path, "n.sqlite", bases["n.sqlite"], None)
    for i in range(10 * SCALE):
        p = tmp_path / f"s{i}" / "n.sqlite"
        p.parent.mkdir()
        p.write_bytes(bases["n.sqlite"])
        c = sqlite3.connect(p)
        c.text_factory = bytes
        ids = [r[0] for r in c.execute("SELECT id FROM StringIds")]
        for _ in range(rng.randrange(1, 4)):
            sid = rng.choice(ids)
            (raw,) = c.execute("SELECT value FROM StringIds WHERE id = ?", [sid]).fetchone()
            k = rng.randrange(len(raw) + 1)
            raw = raw[:k] + rng.choice(BAD_TEXT) * rng.randrange(1, 3) + raw[k:]
            c.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", [raw, sid])
        if rng.random() < 0.5:      # NVTX text carried in the row itself
            c.execute("UPDATE NVTX_EVENTS SET text = CAST(? AS TEXT) WHERE rowid = 1", [b"r\xed\xa0\x80" + b"\x00"])
        c.commit()
        c.close()
        _check(db, p, f"s{i}", None, "nsys text", i, seed)
        p.unlink()
    assert _counts(db, "base") == before


def _deepen(data: bytes, rng: random.Random) -> bytes:
    """DATA with a member nested DEPTH levels deep added to a random object (valid JSON whatever the depth)."""
    starts = [i for i in range(len(data)) if data[i:i + 1] == b"{"]
    at = rng.choice(starts) + 1
    depth = rng.choice((10, 200, 900, sys.getrecursionlimit() + 10, 5000, 40000))
    o, c = rng.choice(((b"[", b"]"), (b'{"d":', b"}")))
    return data[:at] + b'"nf_deep": ' + o * depth + b"0" + c * depth + b", " + data[at:]


@pytest.mark.parametrize("kind, n", [("rank-0.json", 20), ("rank-0.json.gz", 8), ("rank-0.fr.json", 20),
                                     ("manifest.json", 15)])
def test_deep_json_lands_or_fails_in_one_line(db, tmp_path, bases, kind, n):
    seed = int(time.time()) if EXPLORE else 20261208
    rng = random.Random(f"{seed}-{kind}")
    base = bases["rank-0.json" if kind == "manifest.json" else kind]
    before = _store_base(db, tmp_path, kind, base, 0)
    for i in range(n * SCALE):
        d = tmp_path / f"d{i}"
        d.mkdir()
        if kind == "manifest.json":    # a side file beside a rank file, in a directory scan
            (d / "rank-0.json").write_bytes(base)
            (d / kind).write_bytes(_deepen(b'{"world": 2, "files": [{"rank": 0}]}', rng))
            res = _check(db, d, f"d{i}", 0, kind, i, seed)
            assert [r.status for r in res if r.path.endswith("rank-0.json")] == ["stored"], [r.message for r in res]
        else:
            raw = gzip.decompress(base) if kind.endswith(".gz") else base
            data = _deepen(raw, rng)
            (d / kind).write_bytes(gzip.compress(data, 1) if kind.endswith(".gz") else data)
            _check(db, d / kind, f"d{i}", 0, kind, i, seed)
        shutil.rmtree(d)
    assert _counts(db, "base") == before
