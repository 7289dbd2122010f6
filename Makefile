# Two entry points for a fresh machine: `make simulate` (the main job) and `make test`.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# Best effort, never fatal and quiet: chromium for the headless-browser test of the HTML
# report (tests/test_report_html.py skips it without a browser), where apt-get can install
# it (root); the package lists are refreshed only when the first try fails.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[all]"
	$(VENV)/bin/pip install --quiet --no-deps "verl==0.9.1"  # its deps: the 'verl' extra (pyproject.toml)
	-@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || command -v google-chrome >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	            || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; } \
	       >/dev/null 2>&1; } || true
	touch $(STAMP)

# The compiled analysis kernel (rollmux.native): rebuilt when kernel.py changes; best effort,
# never fatal (without a C compiler the source runs, slower).
NATIVE := src/rollmux/_native/kernel.sha256
$(NATIVE): src/rollmux/kernel.py src/rollmux/_csim.c $(STAMP)
	-$(VENV)/bin/rollmux kernel build

.PHONY: install simulate test bench
install: $(STAMP) $(NATIVE)

simulate: $(STAMP) $(NATIVE)
	$(VENV)/bin/rollmux simulate --out out --json out/results.json

# Two passes over the tests not marked slow: first the in-process ones on two workers
# (pytest-xdist), then the `serial` ones (Ray, services, real frameworks, wall-clock
# timing: tests/conftest.py) alone, one at a time. Both always run; the target fails if
# either failed. pytest exits 5 when a pass collects no tests; that is not a failure.
PYTEST := RAY_AUTH_MODE=disabled $(VENV)/bin/python -m pytest
test: $(STAMP) $(NATIVE)
	@$(PYTEST) -m "not slow and not serial" -n 2; a=$$?; [ $$a -eq 5 ] && a=0; \
	$(PYTEST) -m "not slow and serial"; b=$$?; [ $$b -eq 5 ] && b=0; \
	echo "make test: in-process pass rc=$$a, serial pass rc=$$b"; [ $$a -eq 0 ] && [ $$b -eq 0 ]

bench: $(STAMP) $(NATIVE)
	$(VENV)/bin/python benchmarks/planner_latency.py
	$(VENV)/bin/python benchmarks/sim_throughput.py
