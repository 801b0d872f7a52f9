"""Grouped / MoE GEMMs are a class of their own (gemm_grouped) and still GEMMs for every consumer that asks for
gemm: on the generated MoE job (dense GEMMs beside the experts' grouped GEMMs)."""
import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.classify import classify_kernel
from ninefold.ingest.load import ingest_paths


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    import duckdb

    from sample_traces.moe import GROUPED_GEMM, generate_moe
    from ninefold.store.schema import create_all

    d = tmp_path_factory.mktemp("moe")
    generate_moe(d / "job", ranks=4, steps=2, layers=2, seed=3)
    con = duckdb.connect(str(d / "s.duckdb"))
    create_all(con)
    res = ingest_paths(con, sorted((d / "job").glob("rank-*.json")), job="moe")
    assert all(r.status == "stored" for r in res), [r.message for r in res]
    attribute_job(con, "moe")
    yield con, GROUPED_GEMM
    con.close()


def test_kernel_classes_store_the_grouped_gemm_class(moe):
    con, grouped = moe
    kc = dict(con.execute("SELECT name, kclass FROM kernel_classes WHERE job = 'moe'").fetchall())
    assert kc[grouped] == "gemm_grouped"
    assert "gemm" in kc.values()  # the dense GEMMs keep theirs
    assert all(kc[n] == classify_kernel(n)[1] for n in kc if not n.startswith(("Memcpy", "Memset")))


def test_whatif_scale_gemm_takes_the_grouped_gemms_too(moe):
    from ninefold.analysis.whatif import whatif

    con, _ = moe
    grouped = whatif(con, "moe", scale={"gemm_grouped": 0.0})
    every = whatif(con, "moe", scale={"gemm": 0.0})
    both = whatif(con, "moe", scale={"gemm": 0.0, "gemm_grouped": 0.0})
    assert grouped["projected_ns"] < grouped["measured_ns"]
    # gemm is every GEMM, grouped ones included; the dense ones go too: shorter than the grouped ones alone
    assert every["projected_ns"] == both["projected_ns"] < grouped["projected_ns"]


def test_shape_free_calibration_reads_grouped_gemms_as_expert_gemms(moe):
    from ninefold.analysis.cost_model.shapefree import class_times

    con, grouped = moe
    ct = class_times(con, "moe")
    n_grouped = con.execute("SELECT count(*) FROM gpu_ops g JOIN steps w ON w.job = g.job AND w.rank = g.rank "
                            "AND g.start_ns >= w.start_ns AND g.start_ns < w.end_ns WHERE g.job = 'moe' "
                            "AND g.name = ?", [grouped]).fetchone()[0]
    assert n_grouped > 0 and ct["expert_gemm"][1] == n_grouped
    assert ct["gemm"][1] > 0


def test_copies_written_as_kernels_are_charged_as_copies(tmp_path):
    # ROCm 7.1 wrote its copies and fills as kernels (__amd_rocclr_copyBuffer / fillBuffer): the generated job
    # with its copies turned into such kernels gets the ledgers of the original to the nanosecond
    import duckdb

    from sample_traces.generate import generate
    from ninefold.store.schema import create_all

    generate(tmp_path / "dp", ranks=2, steps=2, seed=11)
    got = []
    for rocm in (False, True):
        con = duckdb.connect()
        create_all(con)
        res = ingest_paths(con, sorted((tmp_path / "dp").glob("rank-*.json")), job="dp")
        assert all(r.status == "stored" for r in res), [r.message for r in res]
        if rocm:
            n = con.execute("""UPDATE gpu_ops SET kind = 'kernel', name = CASE kind WHEN 'memcpy'
                               THEN '__amd_rocclr_copyBuffer.kd' ELSE '__amd_rocclr_fillBufferAligned.kd' END
                               WHERE kind IN ('memcpy', 'memset')""").fetchone()[0]
            assert n > 0
        attribute_job(con, "dp")
        got.append(con.execute("SELECT rank, step, ledger, ns FROM ledger_totals ORDER BY ALL").fetchall())
        con.close()
    assert got[1] == got[0]
    assert sum(ns for _, _, led, ns in got[0] if led == "memcpy") > 0
