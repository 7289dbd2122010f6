# Two entry points for a fresh machine: `make simulate` (the main job) and `make test`.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[all]"
	touch $(STAMP)

.PHONY: install simulate test bench
install: $(STAMP)

simulate: $(STAMP)
	$(VENV)/bin/rollmux simulate --out out --json out/results.json

# pytest exits 5 when it collects no tests; that is not a failure of the project.
test: $(STAMP)
	RAY_AUTH_MODE=disabled $(VENV)/bin/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/planner_latency.py
	$(VENV)/bin/python benchmarks/sim_throughput.py
