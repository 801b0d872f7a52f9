"""The named queries behind every view, on a store built from the project's sample traces."""
import duckdb
import numpy as np
import polars as pl
import pytest

from ninefold.analysis.ledgers import LEDGERS
from ninefold.dashboards import queries
from conftest import SHARED_TRACES, needs_shared
from sample_traces.demo_store import build_demo_store
from ninefold.dashboards.views import memory as memory_view
from ninefold.dashboards.views import moe as moe_view
from ninefold.dashboards.views import overview as overview_view


def texts(models) -> str:
    from bokeh.models import Div

    return "".join(m.text for m in models if isinstance(m, Div))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    truth = build_demo_store(d / "demo.duckdb", d)
    return d / "demo.duckdb", truth


@pytest.fixture
def ro(demo):
    con = duckdb.connect(str(demo[0]), read_only=True)
    yield con
    con.close()


@pytest.fixture
def rw_copy(demo, tmp_path):
    """A writable copy of the demo store, for tests that add tables."""
    import shutil

    p = tmp_path / "copy.duckdb"
    shutil.copy(demo[0], p)
    con = duckdb.connect(str(p))
    yield con
    con.close()


def test_jobs_lists_status_step_time_and_worst_ledger(ro):
    j = queries.jobs(ro)
    assert set(j["job"]) == {"dp4", "pp4_1f1b", "moe4"}
    assert set(j["status"]) == {"attributed"}
    raw = ro.execute("""SELECT job, median(m) FROM (SELECT job, step, max(w) AS m FROM
                        (SELECT job, rank, step, sum(ns) AS w FROM ledger_totals GROUP BY ALL) GROUP BY ALL)
                        GROUP BY job""").fetchall()
    for job, med in raw:
        assert j.filter(pl.col("job") == job)["step_ns"][0] == int(med)
    # the pipeline's biggest loss is its bubble
    assert j.filter(pl.col("job") == "pp4_1f1b")["worst_ledger"][0] == "bubble"


def test_jobs_status_ingested_and_failed(rw_copy):
    con = rw_copy
    con.execute("INSERT INTO jobs (job, world_size) VALUES ('bare', 1)")
    con.execute("""INSERT INTO traces (job, rank, path, sha256, format) VALUES ('bare', 0, '/x', 'abc', 'kineto')""")
    con.execute("CREATE TABLE uploads (job VARCHAR, sha256 VARCHAR, name VARCHAR, path VARCHAR, bytes BIGINT, "
                "status VARCHAR, message VARCHAR, updated_at TIMESTAMP)")
    con.execute("INSERT INTO uploads VALUES ('broken', 'f00', 'x.json', '/x.json', 3, 'failed', "
                "'x.json: not a trace', now()::TIMESTAMP)")
    j = queries.jobs(con)
    st = dict(zip(j["job"], j["status"]))
    assert st["bare"] == "ingested" and st["broken"] == "failed" and st["dp4"] == "attributed"
    assert j.filter(pl.col("job") == "broken")["message"][0] == "x.json: not a trace"


def test_overview_per_rank_sums_and_order(ro):
    ov = queries.job_overview(ro, "dp4")
    assert ov.height == 4
    assert ov["step_ns"].to_list() == sorted(ov["step_ns"].to_list(), reverse=True)
    total = ov.select(sum(pl.col(n) for n in LEDGERS)).to_series().to_numpy()
    np.testing.assert_allclose(total, ov["step_ns"].to_numpy())
    raw = dict(ro.execute("SELECT rank, sum(ns) / count(DISTINCT step) FROM ledger_totals WHERE job = 'dp4' "
                          "AND ledger = 'straggler' GROUP BY rank").fetchall())
    for r, v in zip(ov["rank"], ov["straggler"]):
        assert v == pytest.approx(float(raw[r]))


def test_ledger_compare_without_and_with_prediction(ro, rw_copy):
    # moe4 has no shipped config: no prediction until one is stored (dp4's demo prediction: see below)
    cmp = queries.ledger_compare(ro, 'moe4')
    assert cmp["ledger"].to_list() == list(LEDGERS)
    assert cmp["predicted_ns"].null_count() == 9
    html = texts(overview_view.render(overview_view.load(ro, 'moe4')))
    assert queries.NO_PREDICTION in html
    con = rw_copy
    con.execute("CREATE TABLE IF NOT EXISTS predicted_ledgers (job VARCHAR, rank INTEGER, step INTEGER, ledger VARCHAR, "
                "ns BIGINT, config_sha VARCHAR)")
    con.execute("""INSERT INTO predicted_ledgers SELECT job, rank, step, ledger, ns // 2, 'old' FROM ledger_totals
                   WHERE job = 'moe4'""")
    con.execute("""INSERT INTO predicted_ledgers SELECT job, rank, step, ledger, 1000000, 'new' FROM ledger_totals
                   WHERE job = 'moe4'""")
    assert queries.prediction_config(con, 'moe4') == "new"
    cmp2 = queries.ledger_compare(con, 'moe4')
    assert cmp2["predicted_ns"].to_list() == [1e6] * 9
    np.testing.assert_allclose(cmp2["residual_ns"].to_numpy(), cmp2["measured_ns"].to_numpy() - 1e6)
    old = queries.ledger_compare(con, 'moe4', "old")
    np.testing.assert_allclose(old["residual_ns"].to_numpy(), old["predicted_ns"].to_numpy(), rtol=1e-6, atol=1)


def test_demo_dp4_opens_on_measured_vs_predicted(ro):
    # the demo store runs compare with sample_traces/configs/dp4.toml: every ledger has a predicted value
    cmp = queries.ledger_compare(ro, "dp4")
    assert cmp["predicted_ns"].null_count() == 0 and cmp["predicted_ns"].sum() > 0
    html = texts(overview_view.render(overview_view.load(ro, "dp4")))
    assert queries.NO_PREDICTION not in html and "prediction config" in html
    # each residual leads to the terms of its prediction: the same terms `compare --explain` lists
    from ninefold.analysis.cost_model.explain import terms
    from ninefold.analysis.cost_model.predict import predict_file
    from sample_traces.demo_store import SAMPLES

    want: dict = {}
    for t in terms(predict_file(SAMPLES / "configs" / "dp4.toml", ro, "dp4")):
        want.setdefault(t.ledger, []).append((t.term, t.value, t.unit, t.source))
    got = {led: [(t["term"], t["value"], t["unit"], t["source"]) for t in ts]
           for led, ts in queries.predicted_terms(ro, "dp4").items()}
    assert got == want and "compute" in got and "exposed_comm" in got
    for led in got:
        assert f"<details class='nf-terms' data-ledger='{led}'>" in html
    assert "training FLOPs per token" in html and "residual" in html
    assert queries.predicted_terms(ro, "moe4") == {}                    # no prediction stored: nothing to open


def test_stragglers_point_at_the_planted_rank(ro, demo):
    gt = demo[1]["dp4"]
    late = gt["straggler"]["rank"]
    r = queries.straggler_ranks(ro, "dp4")
    assert r["rank"][0] == late
    # the three others each waited about the planted delay for it
    assert r["caused_wait_ns"][0] >= 3 * gt["straggler"]["delay_ns"] * 0.9
    mx = queries.straggler_matrix(ro, "dp4")
    assert mx.height == 4 * len(gt["collectives"])
    seq = gt["straggler"]["seq"]
    row = mx.filter((pl.col("seq") == seq) & (pl.col("rank") == late))
    assert row["last_rank"][0] == late
    assert row["skew_ns"][0] >= gt["straggler"]["delay_ns"]
    # waits agree with the generator's truth up to the clock-alignment residual
    truth = gt["collectives"][seq - 1]["wait_ns"]
    got = mx.filter(pl.col("seq") == seq).sort("rank")["wait_ns"].to_list()
    assert max(abs(a - b) for a, b in zip(got, truth)) < 50_000


def test_moe_drilldown_matches_the_generator(ro, demo):
    gt = demo[1]["moe4"]
    m = queries.moe(ro, "moe4")
    assert m["slowest"] == gt["overloaded_rank"]
    ranks = m["ranks"].sort("rank")
    assert ranks["a2a_count"].to_list() == [len(gt["a2a_calls"])] * 4
    assert ranks["a2a_bytes"].to_list() == gt["a2a_in_bytes_total"]
    assert ranks["expert_gemm_ns"].to_list() == gt["expert_gemm_ns"]
    # the overloaded rank barely waits; the others wait for it in every combine
    w = ranks["a2a_wait_ns"].to_list()
    for r in range(4):
        assert abs(w[r] - gt["a2a_wait_ns_total"][r]) < 60_000 * len(gt["a2a_calls"]) // 2
    assert w[gt["overloaded_rank"]] < min(x for i, x in enumerate(w) if i != gt["overloaded_rank"]) / 5
    led = dict(zip(m["ledgers"]["ledger"], m["ledgers"]["slowest_ns"]))
    mean = dict(zip(m["ledgers"]["ledger"], m["ledgers"]["mean_ns"]))
    assert led["compute"] > mean["compute"] and led["straggler"] < mean["straggler"]
    assert m["predicted_makespan_ns"] is None
    text = texts(moe_view.render(dict(m, job="moe4")))
    assert queries.NO_PREDICTION in text and f"slowest MoE rank {gt['overloaded_rank']}" in text
    # a job without all-to-all has nothing to drill into
    assert queries.moe(ro, "dp4")["slowest"] is None


def test_moe_predicted_makespan(rw_copy):
    con = rw_copy
    con.execute("CREATE TABLE IF NOT EXISTS predicted_ledgers (job VARCHAR, rank INTEGER, step INTEGER, ledger VARCHAR, "
                "ns BIGINT, config_sha VARCHAR)")
    con.execute("""INSERT INTO predicted_ledgers SELECT 'moe4', r, 10, 'compute', 1000 * (r + 1), 'c'
                   FROM range(4) t(r)""")
    assert queries.moe(con, "moe4")["predicted_makespan_ns"] == 4000


def test_pipeline_bubble_against_formula(ro, demo):
    gt = demo[1]["pp4_1f1b"]
    p = queries.pipeline(ro, "pp4_1f1b")
    assert (p["p"], p["m"]) == (gt["stages"], gt["microbatches"])
    assert p["formula"] == pytest.approx(gt["theoretical_bubble_fraction"])
    # measured over each stage's own window; the generator's number is over the pipeline-wide window
    assert p["stages"]["compute_ns"].to_list() == [s["compute_busy_ns"] for s in gt["stage_info"]]
    assert 0.15 < p["measured"] < 0.35
    assert p["schedule"].height > 0 and set(p["schedule"]["rank"]) == {0, 1, 2, 3}
    assert queries.pipeline(ro, "dp4")["p"] == 0


def test_memory_missing_then_present(ro, rw_copy):
    m = queries.memory(ro, "moe4")
    assert m["predicted"].height == 0 and m["measured"].height == 0
    text = texts(memory_view.render(dict(m, job="moe4")))
    assert queries.NO_PREDICTION in text
    con = rw_copy
    con.execute("CREATE TABLE IF NOT EXISTS predicted_memory (job VARCHAR, rank INTEGER, item VARCHAR, bytes BIGINT)")
    con.execute("""INSERT INTO predicted_memory (job, rank, item, bytes) SELECT 'moe4', r, item, b FROM range(4) t(r),
                   (VALUES ('parameters', 2000000000), ('optimizer_states', 6000000000)) v(item, b)""")
    # the store's memory_events table (allocator events from traces recorded with profile_memory=True)
    con.execute("INSERT INTO memory_events (job, rank, ts_ns, total_allocated) SELECT 'moe4', r, i, 1000 * i + r FROM range(4) a(r), range(50) b(i)")
    m2 = queries.memory(con, "moe4")
    assert m2["predicted"].height == 8
    assert m2["measured"].sort("rank")["peak_bytes"].to_list() == [49000, 49001, 49002, 49003]
    models = memory_view.render(dict(m2, job="moe4"))
    assert any(getattr(x, "name", None) == memory_view.PLOT_NAME for x in models)


def test_compare_view_is_the_significance_diff(ro):
    from bokeh.models import Whisker

    from ninefold.analysis.diff import diff_jobs
    from ninefold.dashboards.views import compare as compare_view

    d = compare_view.load(ro, "dp4", "pp4_1f1b")
    want = {(r["level"], r["key"]): r for r in diff_jobs(ro, "dp4", "pp4_1f1b")}
    assert {(r["level"], r["key"]) for r in d["rows"]} == set(want)
    led = [r["key"] for r in d["rows"] if r["level"] == "ledger"]
    assert led == ["step", *LEDGERS]                                   # the step first, then the ledgers in order
    bubble = want[("ledger", "bubble")]
    assert bubble["delta_ns"] > 0 and bubble["significant"]           # the pipeline job's bubble
    models = compare_view.render(d)
    fig = next(m for m in models if getattr(m, "name", None) == compare_view.PLOT_NAME)
    assert any(isinstance(x, Whisker) for x in fig.center)             # each delta drawn with its interval
    src = fig.renderers[0].data_source.data
    assert src["ledger"] == list(LEDGERS)
    i = list(LEDGERS).index("bubble")
    assert src["alpha"][i] == 1.0 and src["delta"][i] == pytest.approx(bubble["delta_ns"] / 1e6)
    text = texts(models)
    assert "nf-diff-ledgers" in text and "significant change" in text
    # a job compared with itself: nothing beyond the noise, every delta zero
    same = compare_view.load(ro, "dp4", "dp4")
    assert not any(r["significant"] for r in same["rows"]) and all(r["delta_ns"] == 0 for r in same["rows"])
    assert "nothing beyond the step-to-step noise" in texts(compare_view.render(same))


def test_efficiency_view_adds_up_to_the_job(ro, rw_copy):
    from ninefold.analysis.efficiency import compute_efficiency, store_efficiency
    from ninefold.dashboards.views import efficiency as eff_view

    rows, _ = compute_efficiency(ro, "dp4")
    d = eff_view.load(ro, "dp4")
    assert d["source"].startswith("computed")
    gpu = ro.execute("SELECT sum(end_ns - start_ns) FROM gpu_ops WHERE job = 'dp4' "
                     "AND kind IN ('kernel', 'memcpy', 'memset')").fetchone()[0]
    assert d["total_ns"] == gpu                                        # every GPU op, once
    ks = d["kernels"]
    assert ks and d["lost_ns"] == sum(r["lost_ns"] for r in rows if r["lost_ns"] is not None)
    assert [k["lost_ns"] for k in ks] == sorted((k["lost_ns"] for k in ks), reverse=True)
    assert all(0 < k["efficiency"] <= 1 for k in ks)
    assert d["known_ns"] + sum(ns for _, _, ns in d["missing"]) == d["total_ns"]
    models = eff_view.render(d)
    fig = next(m for m in models if getattr(m, "name", None) == eff_view.PLOT_NAME)
    top = ks[:eff_view.TOP]
    assert fig.renderers[1].data_source.data["lost"][::-1] == [k["lost_ns"] / 1e6 for k in top]
    assert "nf-efficiency" in texts(models)
    # stored rows (ninefold efficiency) are read, not recomputed, and give the same view
    store_efficiency(rw_copy, "dp4", rows)
    d2 = eff_view.load(rw_copy, "dp4")
    assert d2["source"].startswith("stored") and d2["kernels"] == ks


def test_timeline_bars_cover_each_rank_window(ro):
    step = queries.job_steps(ro, "dp4")[1]
    t = queries.timeline(ro, "dp4", step, max_rows=2_000, width_px=400)
    assert 0 < t.height <= 2_000
    off = dict(ro.execute("SELECT rank, offset_ns FROM clock_offsets WHERE job = 'dp4'").fetchall())
    win = ro.execute("SELECT rank, start_ns, end_ns FROM step_windows WHERE job = 'dp4' AND step = ?",
                     [step]).fetchall()
    t0 = min(s - off[r] for r, s, e in win)
    for r, s, e in win:
        bars = t.filter(pl.col("rank") == r).sort("start_ns")
        assert (bars["end_ns"] - bars["start_ns"]).sum() == e - s  # a partition: no gap, no overlap
        assert bars["start_ns"][0] == s - off[r] - t0
        assert (bars["start_ns"][1:].to_numpy() >= bars["end_ns"][:-1].to_numpy()).all()


def test_timeline_row_cap_on_a_large_job(tmp_path):
    """64 ranks × 40,000 intervals each (2.56 M rows): the query returns at most max_rows bars."""
    con = duckdb.connect(str(tmp_path / "big.duckdb"))
    from ninefold.store.schema import create_all

    create_all(con)
    from ninefold.analysis.attribution.attribute import DDL, INTERVALS_VIEW
    from ninefold.analysis.ledgers import LEDGER_ID

    for t, cols in DDL.items():
        con.execute(f"CREATE TABLE {t} ({cols})")
    con.execute(INTERVALS_VIEW)
    R, N, D = 64, 40_000, 1_000  # ranks, intervals per rank, ns per interval
    con.execute("INSERT INTO jobs (job, world_size) VALUES ('big', 64)")
    con.execute("INSERT INTO traces (job, rank, path, sha256, format) SELECT 'big', r, 'x', 's' || r, 'kineto' "
                "FROM range(64) t(r)")
    c = [LEDGER_ID[k] for k in ("compute", "host", "exposed_comm", "idle")]
    con.execute(f"""INSERT INTO ledger_segments (job, rank, step, ledger_code, start_ns, end_ns)
        SELECT 'big', r, 1, CASE WHEN r = 5 AND i BETWEEN 1000 AND 9999 THEN {LEDGER_ID['straggler']}
                                 ELSE ({c})[1 + (i % 4)::INTEGER] END,
               i * {D}, (i + 1) * {D}
        FROM range({R}) a(r), range({N}) b(i)""")
    con.execute(f"INSERT INTO step_windows (job, rank, step, start_ns, end_ns) SELECT 'big', r, 1, 0, {N * D} FROM range({R}) t(r)")
    assert con.execute("SELECT count(*) FROM ledger_intervals").fetchall()[0][0] == R * N
    t = queries.timeline(con, "big", 1, max_rows=5_000, width_px=1_600)
    assert 0 < t.height <= 5_000
    assert set(t["rank"]) == set(range(R))
    for r in (0, 5, 63):
        bars = t.filter(pl.col("rank") == r)
        assert (bars["end_ns"] - bars["start_ns"]).sum() == N * D
    # a long run of one ledger survives the pooling as one bar
    s5 = t.filter((pl.col("rank") == 5) & (pl.col("ledger") == "straggler"))
    assert s5.height == 1 and s5["end_ns"][0] - s5["start_ns"][0] >= 8_000 * D
    # a hard cap even when the caller asks for very few rows
    assert queries.timeline(con, "big", 1, max_rows=100).height <= 100
    con.close()


def test_queries_cope_with_a_store_that_was_never_attributed(tmp_path):
    from ninefold.store.connection import connect

    con = connect(tmp_path / "fresh.duckdb")
    con.execute("INSERT INTO jobs (job, world_size) VALUES ('j', 1)")
    assert queries.jobs(con)["status"].to_list() == ["ingested"]
    assert queries.job_overview(con, "j").height == 0
    assert queries.ledger_compare(con, "j").height == 0
    assert queries.timeline(con, "j").height == 0
    assert queries.straggler_matrix(con, "j").height == 0
    assert queries.moe(con, "j")["slowest"] is None
    assert queries.pipeline(con, "j")["p"] == 0
    from ninefold.dashboards.views import compare as compare_view
    from ninefold.dashboards.views import efficiency as eff_view

    assert compare_view.load(con, "j", "k")["error"] == "no job 'j' in the store"
    assert "no job &#x27;j&#x27; in the store" in texts(compare_view.render(compare_view.load(con, "j", "k")))
    assert eff_view.render(eff_view.load(con, "j"))
    con.close()


def test_ledger_breakdown_adds_up_to_the_ledgers(ro):
    bd = queries.ledger_breakdown(ro, "dp4", top=10_000)
    assert bd.height > 5
    n = ro.execute("SELECT count(*) FROM step_windows WHERE job = 'dp4' AND end_ns > start_ns").fetchone()[0]
    per = dict(ro.execute("SELECT ledger, sum(ns) FROM ledger_totals WHERE job = 'dp4' GROUP BY ledger").fetchall())
    got = bd.group_by("ledger").agg(pl.col("ns").sum())
    for led, ns in zip(got["ledger"], got["ns"]):
        assert ns == pytest.approx(per[led] / n)
    assert bd["share"].sum() == pytest.approx(1.0)
    keys = set(bd["key"])
    assert "allreduce (dp)" in keys and "gemm" in keys and "copy DtoH" in keys
    html = texts(overview_view.render(overview_view.load(ro, "dp4")))
    assert "Where the time went" in html and "allreduce (dp)" in html


@pytest.fixture(scope="module")
def dlrm2023(tmp_path_factory):
    """A 2023-style 8-rank DLRM job (sample_traces.alltoall2023): all-to-alls as SendRecv kernels under
    nccl:all_to_all, no sequence numbers, so attribution matches every collective by order."""
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import ingest_paths
    from sample_traces.alltoall2023 import generate_a2a
    from ninefold.store.connection import connect

    d = tmp_path_factory.mktemp("a2a")
    gt = generate_a2a(d / "job", ranks=8, steps=2, seed=3)
    con = connect(d / "a2a.duckdb")
    assert all(r.status != "failed" for r in ingest_paths(con, sorted((d / "job").glob("rank-*.json")), job="a2a"))
    attribute_job(con, "a2a")
    yield con, gt
    con.close()


def test_stragglers_read_order_matched_collectives(dlrm2023):
    from ninefold.dashboards.style import fmt_ns
    from ninefold.dashboards.views import stragglers as stragglers_view

    con, gt = dlrm2023
    assert con.execute("SELECT count(*) FROM collective_matches WHERE job = 'a2a' AND seq IS NOT NULL"
                       ).fetchone()[0] == 0  # nothing to match by sequence
    n_colls = sum(len(s["collectives"]) for s in gt["steps"])
    mx = queries.straggler_matrix(con, "a2a")
    assert mx["col"].n_unique() == n_colls and mx.height == 8 * n_colls
    assert set(mx["coll"]) == {"all_to_all", "allreduce"}
    # one clock, all members end together: each rank's straggler time is exactly its planted waits
    r = queries.straggler_ranks(con, "a2a").sort("rank")
    assert r["straggler_ns"].to_list() == gt["straggler_ns_per_rank"]
    assert queries.straggler_total(con, "a2a") == sum(gt["straggler_ns_per_rank"])
    # the planted straggler (the last rank, 400 us late at the third all-to-all of each step) is last there
    third = mx.filter(pl.col("label").str.ends_with("all_to_all #3") & (pl.col("rank") == 7))
    assert third["last_rank"].to_list() == [7] and third["skew_ns"][0] >= 400_000
    html = texts(stragglers_view.render(stragglers_view.load(con, "a2a")))
    assert "no collectives matched" not in html
    assert f"charged to straggler: {fmt_ns(sum(gt['straggler_ns_per_rank']))} over all ranks" in html


def test_moe_counts_order_matched_all_to_alls(dlrm2023):
    con, gt = dlrm2023
    m = queries.moe(con, "a2a")
    ranks = m["ranks"].sort("rank")
    a2a = [c for s in gt["steps"] for c in s["collectives"] if c["host_op"] == "nccl:all_to_all"]
    assert ranks["a2a_count"].to_list() == [len(a2a)] * 8
    assert ranks["a2a_ns"].to_list() == [sum(c["end_true_ns"] - c["arrival_true_ns"][r] for c in a2a)
                                         for r in range(8)]
    assert ranks["a2a_wait_ns"].to_list() == [sum(c["wait_ns"][r] for c in a2a) for r in range(8)]
    assert ranks["a2a_sized"].to_list() == [0] * 8   # old record_param_comms carry no sizes
    text = texts(moe_view.render(dict(m, job="a2a")))
    assert f"in {len(a2a)} calls, sizes not recorded" in text


@needs_shared
def test_moe_one_rank_deepseek_shows_dispatch_combine(tmp_path):
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import load_kineto
    from ninefold.store.connection import connect

    con = connect(tmp_path / "ds.duckdb")
    load_kineto(con, SHARED_TRACES / "deepseek" / "train.json", "ds", rank=0)
    attribute_job(con, "ds")
    m = queries.moe(con, "ds")
    assert m["one_rank"] and m["slowest"] == 0
    row = m["ranks"].row(0, named=True)
    # DeepEP's kernels (dispatch, combine and their notify steps) are this rank's all-to-alls, as classified
    ns, n = con.execute("SELECT sum(end_ns - start_ns), count(*) FROM gpu_ops g JOIN kernel_classes k "
                        "ON k.job = g.job AND k.name = g.name WHERE g.job = 'ds' AND g.kind = 'kernel' "
                        "AND k.family = 'comm' AND k.kclass = 'alltoall'").fetchall()[0]
    dc_ns, dc_n = con.execute("SELECT sum(end_ns - start_ns), count(*) FROM gpu_ops WHERE job = 'ds' "
                              "AND kind = 'kernel' AND (name LIKE '%::dispatch<%' OR name LIKE '%::combine<%')"
                              ).fetchall()[0]
    assert (row["a2a_ns"], row["a2a_count"]) == (ns, n)
    assert ns > dc_ns > 50_000_000 and n > dc_n == 16
    assert row["a2a_wait_ns"] == 0
    # expert GEMM time: the kernels the classifier put in a grouped-GEMM class (no *expert* range in this trace)
    grouped = con.execute("""SELECT coalesce(sum(g.end_ns - g.start_ns), 0), count(*) FROM gpu_ops g
        JOIN kernel_classes k ON k.job = g.job AND k.name = g.name
        WHERE g.job = 'ds' AND g.kind = 'kernel' AND starts_with(k.kclass, 'gemm') AND contains(k.kclass, 'grouped')
        """).fetchone()
    assert (row["expert_gemm_ns"], row["expert_gemms"]) == grouped
    text = texts(moe_view.render(dict(m, job="ds")))
    assert "one rank: no cross-rank comparison" in text and "no all-to-all" not in text
    con.close()


def test_breakdown_names_order_matched_collectives_as_waits_does(dlrm2023):
    from ninefold.analysis.waits import waits

    con, gt = dlrm2023
    bd = queries.ledger_breakdown(con, "a2a", top=10_000)
    # the all-to-all runs as SendRecv kernels: its key is the matched collective's type, not the kernel's class
    assert not any("sendrecv" in k for k in bd["key"])
    strag = bd.filter(pl.col("ledger") == "straggler")
    assert set(strag["key"]) == {"all_to_all", "allreduce"} == set(strag["coll"])
    assert set(bd["coll"].drop_nulls()) <= {r["coll"] for r in waits(con, "a2a")["rows"]}
    # every comm interval is keyed (the gaps the collectives ended too)
    n = con.execute("""SELECT count(*) FROM ledger_drilldown WHERE job = 'a2a' AND kclass IN ('sendrecv', 'allreduce')
                       AND coll IS NULL""").fetchone()[0]
    assert n == 0
    # straggler time per collective type adds up to the planted waits
    per = dict(zip(strag["key"], strag["ns"] * con.execute("SELECT count(*) FROM step_windows WHERE job = 'a2a'"
                                                           ).fetchone()[0]))
    planted = sum(w for s in gt["steps"] for c in s["collectives"] if c["host_op"] == "nccl:all_to_all"
                  for w in c["wait_ns"])
    assert per["all_to_all"] == pytest.approx(planted)


def test_stragglers_view_of_a_pipeline_says_only_send_recv_matched(ro):
    from ninefold.dashboards.views import stragglers as stragglers_view

    # the 1F1B job's matched transfers are all point-to-point: their waits are bubble, not straggler
    assert ro.execute("SELECT bool_and(p2p) AND count(*) > 0 FROM collective_matches WHERE job = 'pp4_1f1b' "
                      "AND matched").fetchone()[0]
    html = texts(stragglers_view.render(stragglers_view.load(ro, "pp4_1f1b")))
    assert "no collective other than point-to-point send/recv matched" in html


def test_moe_expert_gemms_come_from_the_stored_classes(rw_copy, demo):
    """Expert GEMMs are the kernels of a grouped-GEMM class in kernel_classes, or of any gemm* class launched in an
    *expert* range: with the range renamed the generator's grouped GEMMs count only once their stored class says
    grouped."""
    con, gt = rw_copy, demo[1]["moe4"]
    con.execute("UPDATE host_ops SET name = 'moe::ffn' WHERE job = 'moe4' AND name ILIKE '%expert%'")
    # as attributed, the classifier already put the generator's grouped GEMMs in gemm_grouped
    assert queries.moe(con, "moe4")["ranks"].sort("rank")["expert_gemm_ns"].to_list() == gt["expert_gemm_ns"]
    con.execute("UPDATE kernel_classes SET kclass = 'gemm' WHERE job = 'moe4' AND kclass = 'gemm_grouped'")
    assert queries.moe(con, "moe4")["ranks"]["expert_gemm_ns"].to_list() == [0] * 4
    con.execute("UPDATE kernel_classes SET kclass = 'gemm_grouped' WHERE job = 'moe4' AND name LIKE '%gemm_grouped%'")
    assert queries.moe(con, "moe4")["ranks"].sort("rank")["expert_gemm_ns"].to_list() == gt["expert_gemm_ns"]
