"""Seeded mutation fuzzing of ingest: Kineto JSON and .json.gz, Flight Recorder JSON, NCCL logs, nsys SQLite.

Every mutated input either lands or fails with one line naming the file; a failure stores nothing; a traceback
is a defect; the store still opens and the jobs already in it are unchanged. The gate draws a fixed 1,000+
inputs; HYPOTHESIS_PROFILE=explore draws 10,000+ fresh ones (a new seed each run).
"""
import gzip
import os
import random
import time

import pytest

from ingest.load import ingest_paths
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
