# The two entry points a new user runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/ninefold: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: demo test bench
demo: $(BIN)/ninefold
	rm -rf demo_out && mkdir -p demo_out
	$(BIN)/python -m sample_traces.generate demo_out/sample_job --ranks 4 --steps 3 --seed 0
	$(BIN)/ninefold ingest demo_out/sample_job/rank-*.json --job sample_job --db demo_out/ninefold.duckdb
	$(BIN)/ninefold summary --db demo_out/ninefold.duckdb
	$(BIN)/ninefold attribute --db demo_out/ninefold.duckdb
	$(BIN)/ninefold ledgers --db demo_out/ninefold.duckdb --job sample_job

test: $(BIN)/ninefold
	$(BIN)/python -m pytest -q

bench: $(BIN)/ninefold
	$(BIN)/python bench/bench_ingest.py
