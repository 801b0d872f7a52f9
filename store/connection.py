"""Opening the DuckDB store."""
from pathlib import Path

import duckdb

from store.schema import create_all


def connect(db: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    # no progress bar: it writes to stdout, which the CLI's output owns
    if read_only:
        con = duckdb.connect(str(db), read_only=True)
        con.execute("SET enable_progress_bar = false")
        return con
    con = duckdb.connect(str(db))
    con.execute("SET enable_progress_bar = false")
    create_all(con)
    return con
