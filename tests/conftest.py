import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# Property tests draw the same examples on every run, so the test gate cannot turn red by chance;
# HYPOTHESIS_PROFILE=explore draws fresh examples on each run to hunt for new counterexamples (pin any it
# finds with @example).
settings.register_profile("gate", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))
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
