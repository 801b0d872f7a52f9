"""numpy <-> Arrow for fixed-width columns, straight over the buffers.

pyarrow's own conversions (``pa.array`` of anything, ``Array.to_numpy``, ``np.asarray`` of an Arrow array) first
ask whether the object is a pandas one, which imports pandas: about 0.2 s in every process that converts once
(a ``ninefold ingest`` of one file, a batch worker). These helpers build and read the buffers themselves.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

_TYPES: dict[np.dtype, pa.DataType] = {np.dtype(np.int8): pa.int8(), np.dtype(np.int16): pa.int16(), np.dtype(np.int32): pa.int32(),
          np.dtype(np.int64): pa.int64(), np.dtype(np.uint8): pa.uint8(), np.dtype(np.uint16): pa.uint16(),
          np.dtype(np.uint32): pa.uint32(), np.dtype(np.uint64): pa.uint64(), np.dtype(np.float32): pa.float32(),
          np.dtype(np.float64): pa.float64()}
_DTYPES: dict[pa.DataType, np.dtype] = {at: d for d, at in _TYPES.items()}


def _validity(valid: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(valid.astype(np.bool_), bitorder="little"))


def from_numpy(a, mask=None) -> pa.Array:
    """An Arrow array over the values of the 1-d numpy array A (its integer, float or bool dtype); MASK (bool,
    True = NULL) makes those slots NULL."""
    a = np.ascontiguousarray(a)
    if a.ndim != 1:
        raise ValueError(f"a 1-d array is needed, not {a.ndim}-d")
    valid = None if mask is None else _validity(~np.asarray(mask, dtype=np.bool_))
    nulls = -1 if mask is None else int(np.count_nonzero(mask))
    if a.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), a.size, [valid, _validity(a)], null_count=nulls)
    if a.dtype not in _TYPES:
        raise TypeError(f"no Arrow type for numpy {a.dtype}")
    return pa.Array.from_buffers(_TYPES[a.dtype], a.size, [valid, pa.py_buffer(a)], null_count=nulls)


def strings(values) -> pa.Array:
    """An Arrow string array of the Python strings VALUES (none NULL)."""
    data = [str(v).encode() for v in values]
    offsets = np.zeros(len(data) + 1, np.int32)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def to_numpy(col) -> np.ndarray:
    """The values of a fixed-width or boolean Arrow Array / ChunkedArray as numpy: a read-only view of a single
    chunk, else a copy; NULL slots hold whatever bytes they have."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    t = col.type
    if pa.types.is_boolean(t):
        parts = [_bits(c.buffers()[1], c.offset, len(c)) for c in chunks if len(c)]
        return np.concatenate(parts) if parts else np.zeros(0, np.bool_)
    dtype = _numpy_dtype(t)
    parts = [np.frombuffer(c.buffers()[1], dtype, len(c), c.offset * dtype.itemsize) for c in chunks if len(c)]
    if not parts:
        return np.zeros(0, dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _numpy_dtype(t: pa.DataType) -> np.dtype:
    if t not in _DTYPES:
        raise TypeError(f"no fixed-width numpy dtype for Arrow {t}")
    return _DTYPES[t]


def values(col) -> np.ndarray:
    """to_numpy where COL is fixed-width (or boolean) and NULL-free; anything else through pyarrow's own
    conversion (NULLs as NaN, strings as objects)."""
    if col.null_count == 0 and (pa.types.is_boolean(col.type) or col.type in _DTYPES):
        return to_numpy(col)
    return col.to_numpy()


def table(cols: dict) -> pa.Table:
    """pa.table of COLS (name -> numpy array or Arrow array), the numpy ones through from_numpy."""
    return pa.table({k: from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in cols.items()})


def batch(arrays, schema: pa.Schema) -> pa.RecordBatch:
    """A record batch of SCHEMA over ARRAYS (numpy, each in its field's type or converted to it)."""
    return pa.RecordBatch.from_arrays(
        [from_numpy(np.asarray(a, dtype=_numpy_dtype(f.type))) if isinstance(a, np.ndarray) else a
         for a, f in zip(arrays, schema)], schema=schema)


def filled(col, value=0) -> np.ndarray:
    """to_numpy of a fixed-width or boolean COL with its NULL slots set to VALUE (0 is False for a boolean one;
    ``fill_null`` makes a pyarrow scalar of VALUE, which imports pandas)."""
    v = to_numpy(col)
    if col.null_count:
        v = np.where(to_numpy(col.is_null()), np.asarray(value, dtype=v.dtype), v)
    return v


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """N bits of BUF from bit OFFSET as bools; only those bytes are unpacked (a slice shares its parent's buffer)."""
    lo = offset >> 3
    raw = np.frombuffer(buf, np.uint8, ((offset + n + 7) >> 3) - lo, lo)
    return np.unpackbits(raw, bitorder="little")[offset & 7:(offset & 7) + n].astype(np.bool_)
