"""`ninefold inspect`: what each trace can tell, on every file of the shared corpus and on a store."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SHARED_TRACES, needs_shared
from service.cli import cli

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
