"""Opening the DuckDB store."""
from pathlib import Path

import duckdb

from store.schema import create_all


def connect(db: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    if read_only:
        return duckdb.connect(str(db), read_only=True)
    con = duckdb.connect(str(db))
    create_all(con)
    return con
