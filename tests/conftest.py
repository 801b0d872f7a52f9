import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("NINEFOLD_SHARED_TRACES", ROOT.parent / "shared" / "traces"))

needs_shared = pytest.mark.skipif(
    not SHARED_TRACES.is_dir(),
    reason=f"the shared trace corpus is not beside this checkout ({SHARED_TRACES})",
)


@pytest.fixture
def db(tmp_path):
    from store.connection import connect

    con = connect(tmp_path / "t.duckdb")
    yield con
    con.close()
