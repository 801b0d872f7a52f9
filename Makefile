# The two entry points a new user runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/ninefold: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Browser tests drive the system's Chromium (Debian's package); install it when missing.
CHROMIUM := $(shell command -v chromium || command -v chromium-browser)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test lint bench chromium
chromium:
ifeq ($(CHROMIUM),)
	$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium
endif

demo: $(BIN)/ninefold
	rm -rf demo_out && mkdir -p demo_out
	$(BIN)/python -m sample_traces.generate demo_out/sample_job --ranks 4 --steps 3 --seed 0
	$(BIN)/ninefold ingest demo_out/sample_job/rank-*.json --job sample_job --db demo_out/ninefold.duckdb
	$(BIN)/ninefold summary --db demo_out/ninefold.duckdb
	$(BIN)/ninefold attribute --db demo_out/ninefold.duckdb
	$(BIN)/ninefold ledgers --db demo_out/ninefold.duckdb --job sample_job
	$(BIN)/ninefold compare --db demo_out/ninefold.duckdb --job sample_job --config sample_traces/configs/dp4.toml
	$(BIN)/ninefold report --db demo_out/ninefold.duckdb --job sample_job --out demo_out/report.html
	@echo "report: demo_out/report.html   (dashboards: $(BIN)/ninefold serve --db demo_out/ninefold.duckdb)"

lint: $(BIN)/ninefold
	$(BIN)/ruff check ninefold tests bench sample_traces
	$(BIN)/mypy

test: $(BIN)/ninefold chromium
	$(BIN)/python -m pytest -q

bench: $(BIN)/ninefold
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
