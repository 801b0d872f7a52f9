"""The critical path agrees with the ledgers: for every (step, rank, ledger) the path's time charged to that ledger
on that rank is at most the rank's own time in that ledger and step (ledger_totals), within TOL_NS; and no host-side
piece (the host's own time, a launch, a synchronize, a gap) sits where the rank's GPU was running an op."""

TOL_NS = 1_000


def path_over_ledgers(con, job, tol_ns=TOL_NS):
    """Rows (step, rank, ledger, path ns, ledger ns) where the stored critical path of JOB charges a rank's ledger
    more than the rank's own step holds (a path row without a ledger counts against nothing)."""
    return con.execute("""
        WITH p AS (SELECT step, rank, ledger, sum(aligned_end_ns - aligned_start_ns) AS ns FROM critical_path
                   WHERE job = ? AND ledger IS NOT NULL GROUP BY ALL)
        SELECT p.step, p.rank, p.ledger, p.ns, coalesce(t.ns, 0) FROM p
        LEFT JOIN ledger_totals t ON t.job = ? AND t.step = p.step AND t.rank = p.rank AND t.ledger = p.ledger
        WHERE p.ns > coalesce(t.ns, 0) + ? ORDER BY ALL""", [job, job, tol_ns]).fetchall()


def assert_path_within_ledgers(con, job, tol_ns=TOL_NS):
    n = con.execute("SELECT count(*) FROM critical_path WHERE job = ?", [job]).fetchone()[0]
    assert n, f"{job}: no critical path stored"
    over = path_over_ledgers(con, job, tol_ns)
    assert not over, f"{job}: the path charges more than the rank's ledger (step, rank, ledger, path, ledger): {over}"
    busy = con.execute("""SELECT step, rank, kind, ledger, op_name FROM critical_path WHERE job = ?
                          AND kind IN ('host', 'launch', 'sync', 'gap')
                          AND ledger IN ('compute', 'recompute', 'exposed_comm', 'memcpy', 'straggler')
                          LIMIT 5""", [job]).fetchall()
    assert not busy, f"{job}: host-side pieces over a busy GPU: {busy}"
