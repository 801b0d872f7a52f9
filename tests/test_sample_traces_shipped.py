"""The shipped samples are exactly what the seeded generators make, and they ingest."""
import gzip
from pathlib import Path

from ninefold.ingest.load import ingest_paths
from sample_traces.generate import generate

SHIPPED = Path(__file__).resolve().parents[1] / "sample_traces"


def test_dp4_is_reproducible_and_ingests(tmp_path, db):
    generate(tmp_path, ranks=4, steps=3, seed=0, gzip=True)
    for r in range(4):
        a = gzip.decompress((SHIPPED / "dp4" / f"rank-{r}.json.gz").read_bytes())
        b = gzip.decompress((tmp_path / f"rank-{r}.json.gz").read_bytes())
        assert a.split(b"\"traceName\"")[0] == b.split(b"\"traceName\"")[0]  # traceName holds the path
    res = ingest_paths(db, sorted((SHIPPED / "dp4").glob("rank-*.json.gz")), job="dp4")
    assert [r.status for r in res] == ["stored"] * 4
    res = ingest_paths(db, sorted((SHIPPED / "pp4_1f1b").glob("stage-*.json.gz")), job="pp")
    assert [r.status for r in res] == ["stored"] * 4
