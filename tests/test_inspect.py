"""`ninefold inspect`: what each trace can tell, on every file of the shared corpus and on a store."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SHARED_TRACES, needs_shared
from ninefold.cli.main import cli

SUFFIXES = (".json", ".json.gz", ".log", ".sqlite", ".txt", ".pkl", ".pickle", ".out")


@pytest.fixture(scope="module")
def corpus():
    # paths as stored: resolved (the corpus may be reached through a symlink)
    files = sorted(str(p.resolve()) for p in SHARED_TRACES.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    r = CliRunner().invoke(cli, ["inspect", *files, "--format", "json"])
    assert r.exception is None, r.exception
    assert r.exit_code == 0, r.output[-2000:]
    doc = json.loads(r.output)
    return files, {str(Path(t["path"]).resolve()): t for t in doc["traces"]}, doc["errors"]


def _caps(t):
    return {k: v["state"] for k, v in t["capabilities"].items()}


@needs_shared
def test_every_file_is_inspected_or_refused_in_one_line(corpus):
    files, traces, errors = corpus
    refused = {e.split(":")[0].split(" at ")[0] for e in errors}
    assert all("\n" not in e for e in errors)
    missing = [f for f in files if f not in traces and f not in refused
               and not f.endswith(".pkl")]  # a dump stored as JSON and pickle: both read, listed once per job
    assert not missing, missing[:5]
    assert sum(t["kind"] == "kineto" for t in traces.values()) >= 60
    assert {t["kind"] for t in traces.values()} >= {"kineto", "nsys", "nccl_log", "flight_recorder"}


@needs_shared
def test_verdicts_on_one_trace_of_each_kind(corpus):
    _, traces, _ = corpus
    t = lambda rel: traces[str((SHARED_TRACES / rel).resolve())]  # noqa: E731
    shapes = t("kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    assert _caps(shapes)["efficiency_calibration"] == "available" and _caps(shapes)["memory_ledger"] == "available"
    noshape = t("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    v = noshape["capabilities"]["efficiency_calibration"]
    assert v["state"] == "unavailable" and "record_shapes=True" in v["fix"]
    rec = t("hta/nccl_parser_config/nccl_data.json.gz")
    assert rec["facts"]["collectives_recorded"] > 0
    old = t("hta/trace_filter/sampled_rank-0.json.gz")
    assert old["facts"]["collectives_recorded"] == 0 and old["facts"]["collectives_from_host_ops"] == 10
    v = old["capabilities"]["straggler_bubble"]
    assert v["state"] == "degraded" and "2 of 128 ranks" in v["why"]
    nsys = t("pipit_nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    assert nsys["kind"] == "nsys" and _caps(nsys)["ledgers"] == "available"
    log = t("nccl_logs/nccl_issue1193_ray_allreduce_128ranks_COLL.log")
    assert log["kind"] == "nccl_log" and _caps(log)["nccl_drilldown"] == "available"
    fr = t("flight_recorder_gloo_4rank/rank-0.json")
    assert fr["kind"] == "flight_recorder" and _caps(fr)["hang_report"] == "available"
    cpu = t("torch_cpu_gloo_2rank/rank-0.pt.trace.json")
    assert _caps(cpu)["ledgers"] == "unavailable" and "ProfilerActivity.CUDA" in cpu["capabilities"]["ledgers"]["fix"]


def test_inspect_a_store_and_text_output(tmp_path):
    from sample_traces.checkpointed import generate_checkpointed

    generate_checkpointed(tmp_path / "ck", ranks=2, steps=1)
    db = str(tmp_path / "s.duckdb")
    r = CliRunner().invoke(cli, ["ingest", str(tmp_path / "ck"), "--db", db, "--job", "ck"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["inspect", "--db", db, "--job", "ck"])
    assert r.exit_code == 0, r.output
    assert "recompute                available" in r.output and "docs/capture.md" in r.output
    assert "memory_ledger            unavailable" in r.output and "profile_memory=True" in r.output
    r = CliRunner().invoke(cli, ["inspect", str(tmp_path / "ck"), "--db", db])
    assert r.exit_code == 2 and "not both" in r.output


def test_version_and_a_worked_example_in_every_commands_help():
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("ninefold, version ")
    for name in cli.commands:
        r = CliRunner().invoke(cli, [name, "--help"])
        assert r.exit_code == 0 and "Example: ninefold " + name in r.output, name


def _comm_counts(db, job):
    """What attribute charged as communication, per rank: kernels of the comm family (kernel_classes) and the
    collective each matched kernel was typed as (collective_matches)."""
    from ninefold.analysis.process_groups import canonical

    fam = dict(db.execute("""SELECT g.rank, count(*) FROM gpu_ops g JOIN kernel_classes kc
                             ON kc.job = g.job AND kc.name = g.name
                             WHERE g.job = ? AND g.kind = 'kernel' AND kc.family = 'comm' GROUP BY 1""",
                          [job]).fetchall())
    by = {}
    for r, coll, n in db.execute("SELECT rank, coll, count(*) FROM collective_matches WHERE job = ? GROUP BY ALL",
                                 [job]).fetchall():
        c = canonical(coll) or coll
        by.setdefault(r, {})[c] = by.setdefault(r, {}).get(c, 0) + n
    return fam, by


def _inspected(db_path, job):
    r = CliRunner().invoke(cli, ["inspect", "--db", db_path, "--job", job, "--format", "json"])
    assert r.exit_code == 0, r.output
    return {t["rank"]: t for t in json.loads(r.output)["traces"]}


@needs_shared
def test_inspect_counts_the_comm_kernels_attribute_charges_on_deepseek(tmp_path):
    # DeepSeek-V3's training rank: its communication is DeepEP (dpsk::ep) dispatch / combine / notify kernels,
    # no NCCL kernel at all; inspect said "0 comm kernels" while attribute charged exposed communication
    db = str(tmp_path / "ds.duckdb")
    r = CliRunner().invoke(cli, ["ingest", str(SHARED_TRACES / "deepseek" / "train.json"), "--db", db, "--job", "ds",
                                 "--rank", "0"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["attribute", "--db", db, "--job", "ds"])
    assert r.exit_code == 0, r.output
    t = _inspected(db, "ds")[0]
    from ninefold.store.connection import connect

    con = connect(db, read_only=True)
    fam, by = _comm_counts(con, "ds")
    exposed = con.execute("SELECT sum(ns) FROM ledger_totals WHERE job = 'ds' AND ledger = 'exposed_comm'"
                          ).fetchone()[0]
    con.close()
    assert exposed > 0
    assert t["facts"]["comm_kernels"] == fam[0] > 0
    assert t["facts"]["comm_by_collective"] == by[0] == {"alltoall": fam[0]}
    v = t["capabilities"]["straggler_bubble"]
    assert v["state"] == "degraded" and "one rank" in v["why"]


def test_inspect_types_comm_kernels_as_attribute_does_on_a_generated_job(tmp_path):
    # 2023-style all-to-all: ncclKernel_SendRecv kernels launched under nccl:all_to_all are all-to-alls, the
    # all-reduce kernels all-reduces; inspect of the files (a private store) and of the attributed store agree
    from sample_traces.alltoall2023 import generate_a2a

    generate_a2a(tmp_path / "a2a", ranks=2, steps=2, seed=5)
    db = str(tmp_path / "s.duckdb")
    for cmd in (["ingest", str(tmp_path / "a2a"), "--db", db, "--job", "a2a"],
                ["attribute", "--db", db, "--job", "a2a"]):
        r = CliRunner().invoke(cli, cmd)
        assert r.exit_code == 0, r.output
    from ninefold.store.connection import connect

    con = connect(db, read_only=True)
    fam, by = _comm_counts(con, "a2a")
    con.close()
    stored = _inspected(db, "a2a")
    r = CliRunner().invoke(cli, ["inspect", str(tmp_path / "a2a"), "--format", "json"])
    assert r.exit_code == 0, r.output
    files = {t["rank"]: t for t in json.loads(r.output)["traces"]}
    for rank in (0, 1):
        for t in (stored[rank], files[rank]):
            assert t["facts"]["comm_kernels"] == fam[rank] == 16
            assert t["facts"]["comm_by_collective"] == by[rank] == {"alltoall": 10, "allreduce": 6}
    r = CliRunner().invoke(cli, ["inspect", "--db", db, "--job", "a2a"])
    assert "16 comm kernels: alltoall 10, allreduce 6" in r.output
