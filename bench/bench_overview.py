"""Server-side cost of the job overview on a synthetic 1,024-rank job, against the raw SELECT of the same rows,
run side by side.

    python bench/bench_overview.py [--ranks 1024] [--steps 20] [--repeat 5]

The job's ledger_totals / traces / steps rows are generated in SQL (nothing is ingested). "overview" is what the
server does for one page view: the named query (per-rank pivot of the nine ledgers, sorted by step time), the
Bokeh figure (vbar_stack, one bar per rank) and its serialisation to JSON (bokeh.embed.json_item). "baseline" is
a plain SELECT of the job's ledger_totals rows into Arrow. Prints the best of N runs of each, and the ratio.
Target: overview < 2 s at 1,024 ranks.
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bokeh.embed import json_item  # noqa: E402

from ninefold.analysis.attribution.attribute import DDL  # noqa: E402
from ninefold.analysis.ledgers import LEDGERS  # noqa: E402
from ninefold.dashboards import queries  # noqa: E402
from ninefold.dashboards.views.overview import ledger_figure  # noqa: E402
from ninefold.store.connection import connect  # noqa: E402


def build(con, ranks: int, steps: int) -> None:
    for t, cols in DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")
    con.execute(f"INSERT INTO jobs (job, world_size) VALUES ('big', {ranks})")
    con.execute(f"""INSERT INTO traces (job, rank, path, sha256, format, world_size)
        SELECT 'big', r, 'rank-' || r || '.json', 'sha' || r, 'kineto', {ranks} FROM range({ranks}) t(r)""")
    con.execute(f"""INSERT INTO steps SELECT 'big', r, s, s * 40000000, (s + 1) * 40000000
        FROM range({ranks}) a(r), range({steps}) b(s)""")
    led = ", ".join(f"'{n}'" for n in LEDGERS)
    # ledgers of 0..4 ms per rank-step with a few slow ranks; values vary by rank, step and ledger
    con.execute(f"""INSERT INTO ledger_totals (job, rank, step, ledger, ns)
        SELECT 'big', r, s, l, (hash(r, s, l) % 4000000)::BIGINT + CASE WHEN r % 97 = 0 AND l = 'straggler'
                                                                        THEN 5000000 ELSE 0 END
        FROM range({ranks}) a(r), range({steps}) b(s), unnest([{led}]) c(l)""")


def overview_once(con):
    df = queries.job_overview(con, "big")
    fig = ledger_figure(df)
    return len(json.dumps(json_item(fig))), df.height


def baseline_once(con):
    t = con.sql("SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = 'big'").to_arrow_table()
    return t.num_rows


def best(fn, con, repeat):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(con)
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        con = connect(Path(d) / "bench.duckdb")
        t0 = time.perf_counter()
        build(con, a.ranks, a.steps)
        n_rows = con.execute("SELECT count(*) FROM ledger_totals").fetchall()[0][0]
        print(f"synthetic job: {a.ranks} ranks x {a.steps} steps x 9 ledgers = {n_rows} ledger_totals rows "
              f"(built in {time.perf_counter() - t0:.2f}s)")
        overview_once(con)  # warm imports and caches once
        tb, rows = best(baseline_once, con, a.repeat)
        to, (nbytes, bars) = best(overview_once, con, a.repeat)
        con.close()
    print(f"baseline  raw SELECT of {rows} rows:                     {tb * 1000:8.1f} ms")
    print(f"overview  query + figure ({bars} bars) + JSON ({nbytes / 2 ** 20:.2f} MiB): {to * 1000:8.1f} ms")
    print(f"ratio overview / baseline: {to / tb:.1f}x   target overview < 2 s: {'PASS' if to < 2 else 'FAIL'}")


if __name__ == "__main__":
    main()
