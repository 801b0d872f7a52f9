"""ninefold.store.arrays: numpy <-> Arrow over the buffers, equal to pyarrow's own conversions; and ingest and attribution
that never import pandas (pyarrow's conversions would, ~0.2 s a process)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ninefold.store.arrays import batch, filled, from_numpy, strings, table, to_numpy, values

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_from_numpy_equals_pa_array(dtype):
    rng = np.random.default_rng(3)
    a = (rng.integers(0, 2, 1000) if dtype is np.bool_ else rng.integers(-100, 100, 1000)).astype(dtype)
    mask = rng.random(1000) < 0.2
    assert from_numpy(a).equals(pa.array(a))
    got = from_numpy(a, mask=mask)
    assert got.equals(pa.array(a, mask=mask))
    assert got.null_count == int(mask.sum())
    # a strided view is made contiguous first
    assert from_numpy(a[::3]).equals(pa.array(a[::3]))


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_to_numpy_equals_pyarrow(dtype):
    rng = np.random.default_rng(4)
    parts = [(rng.integers(0, 2, n) if dtype is np.bool_ else rng.integers(-50, 50, n)).astype(dtype)
             for n in (7, 0, 130, 1)]
    col = pa.chunked_array([pa.array(p) for p in parts], pa.from_numpy_dtype(dtype))
    assert np.array_equal(to_numpy(col), np.concatenate(parts))
    assert to_numpy(col).dtype == np.dtype(dtype)
    # slices: an offset into the buffers (bit offset for bools)
    arr = pa.array(np.concatenate(parts))
    for a, b in ((3, 50), (9, 9), (0, 138), (131, 138)):
        assert np.array_equal(to_numpy(arr.slice(a, b - a)), np.concatenate(parts)[a:b]), (a, b)
    assert to_numpy(pa.chunked_array([], pa.from_numpy_dtype(dtype))).size == 0


def test_filled_values_table_batch():
    col = pa.chunked_array([pa.array([1, None, 3], pa.int32()), pa.array([None, 5], pa.int32())])
    assert filled(col).tolist() == [1, 0, 3, 0, 5]
    assert filled(col, 9).tolist() == [1, 9, 3, 9, 5]
    assert filled(pa.array([True, None, False])).tolist() == [True, False, False]
    assert filled(pa.array([True, None, False]), True).tolist() == [True, True, False]
    # values: the buffers where NULL-free and fixed-width, pyarrow's conversion otherwise (NaN, objects)
    assert values(pa.chunked_array([pa.array([4, 5], pa.int64())])).tolist() == [4, 5]
    assert np.isnan(values(pa.chunked_array([pa.array([4, None], pa.int64())]))[1])
    assert values(pa.chunked_array([pa.array(["a"])])).tolist() == ["a"]
    t = table({"a": np.arange(3, dtype=np.int32), "b": strings(["x", "y", "z"])})
    assert t.equals(pa.table({"a": pa.array([0, 1, 2], pa.int32()), "b": ["x", "y", "z"]}))
    schema = pa.schema([("r", pa.int32()), ("s", pa.int64()), ("l", pa.uint8())])
    b = batch([np.array([1, 2], np.int64), np.array([7, 8], np.int64), np.array([0, 3], np.uint8)], schema)
    assert b.schema == schema and b.column(0).to_pylist() == [1, 2] and b.column(2).to_pylist() == [0, 3]


def test_strings_and_errors():
    assert strings(["a", "", "ÿé", "job 1"]).equals(pa.array(["a", "", "ÿé", "job 1"], pa.string()))
    assert strings([]).equals(pa.array([], pa.string()))
    with pytest.raises(TypeError, match="no Arrow type"):
        from_numpy(np.array(["x"], dtype=object))
    with pytest.raises(ValueError, match="1-d"):
        from_numpy(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="no fixed-width"):
        to_numpy(pa.array(["x"]))


def _ingest_imports_pandas(tmp_path, trace, attribute=False) -> str:
    code = ("import sys, ninefold.ingest.load as L; from ninefold.store.connection import connect; "
            f"con = connect({str(tmp_path / 'p.duckdb')!r}); "
            f"rs = L.ingest_paths(con, [{str(trace)!r}], job='j'); "
            "assert rs and all(r.status in ('stored', 'skipped') for r in rs), rs; "
            + ("from ninefold.analysis.attribution.attribute import attribute_job; attribute_job(con, 'j'); " if attribute else "")
            + "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_kineto_ingest_and_attribution_import_no_pandas(tmp_path):
    from sample_traces.generate import generate

    generate(tmp_path / "job", ranks=2, steps=2, seed=5)
    assert _ingest_imports_pandas(tmp_path, tmp_path / "job", attribute=True) == "False"


def test_nsys_ingest_imports_no_pandas(tmp_path):
    export = SHARED / "nsys_misc" / "fuser" / "report1.sqlite"
    if not export.exists():
        pytest.skip(f"{export} is not here (the shared traces folder is missing)")
    assert _ingest_imports_pandas(tmp_path, export) == "False"
