"""A demo store from the project's own sample traces: dp4 (straggler), pp4_1f1b (pipeline bubble) and a
generated MoE job (overloaded expert rank). Used by the web tests and handy for trying ``ninefold serve``.

    python -m sample_traces.demo_store OUT_DIR     # writes OUT_DIR/demo.duckdb
"""
from __future__ import annotations

import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent


def sample_files(name: str) -> list[Path]:
    return sorted(p for p in (SAMPLES / name).iterdir() if p.name.startswith(("rank-", "stage-")))


def build_demo_store(db_path, work_dir, jobs=("dp4", "pp4_1f1b", "moe4")) -> dict:
    """Ingest + attribute the demo jobs into DB_PATH; returns {job: ground truth dict}."""
    import json

    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import ingest_paths
    from sample_traces.moe import generate_moe
    from ninefold.store.connection import connect

    work = Path(work_dir)
    truth = {}
    con = connect(db_path)
    try:
        for job in jobs:
            if job == "moe4":
                d = work / "moe4"
                truth[job] = generate_moe(d, ranks=4, steps=2, layers=3, overloaded=2, seed=0)
                files = sorted(d.glob("rank-*.json"))
            else:
                files = sample_files(job)
                truth[job] = json.loads((SAMPLES / job / "ground_truth.json").read_text())
            res = ingest_paths(con, files, job=job)
            bad = [r.message for r in res if r.status == "failed"]
            if bad:
                raise RuntimeError(f"demo job {job}: {bad}")
            attribute_job(con, job)
            cfg = SAMPLES / "configs" / f"{job}.toml"
            if cfg.exists():  # measured vs predicted, as `make demo` shows it
                from ninefold.analysis.cost_model import compare as cmp
                from ninefold.analysis.cost_model.predict import predict_file

                cmp.store(con, job, predict_file(cfg, con, job))
    finally:
        con.close()
    return truth


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo_out")
    out.mkdir(parents=True, exist_ok=True)
    build_demo_store(out / "demo.duckdb", out)
    print(out / "demo.duckdb")
