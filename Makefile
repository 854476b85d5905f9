# Set-up and checks. `make demo` and `make test` are the two commands the README starts with; `make lint` is
# the rest of what CI (.ci/run) checks.
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch on this kind of machine. GPU users: install your CUDA/ROCm torch into the venv
# first (or point VENV at an environment that has it) and set TORCH_SPEC= to skip this.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint docs venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: venv
	$(VENV)/bin/sweep run examples/demo.yaml --cluster local --output results
	$(VENV)/bin/sweep results show results

# The tests that start no Ray or ranks are single-process: spread over every core (pytest-xdist; on a 2-core machine
# `pytest -m "not integration"` took 375 s, with `-n 2` 202 s). The integration tests share one Ray instance and
# already keep both cores busy: with `-n 2` they took 1,337 s and a timeout test failed, against 1,338 and 1,466 s
# serially in two fresh-clone CI runs (no faster, and flaky): serial, one session.
# Both lanes, every worker, share one folder of inductor's C++ builds (tests/conftest.py `_cache_compiler_builds`;
# one set outside, or `off`, is kept).
TEST_WORKERS ?= auto
test: venv
	builds=$${SWEEP_TEST_CXX_CACHE:-$$(mktemp -d)}; \
	SWEEP_TEST_CXX_CACHE=$$builds $(PY) -m pytest -q -m "not integration" -n $(TEST_WORKERS) tests && \
	SWEEP_TEST_CXX_CACHE=$$builds $(PY) -m pytest -q -m integration tests; \
	rc=$$?; [ -n "$$SWEEP_TEST_CXX_CACHE" ] || rm -rf "$$builds"; exit $$rc

lint: venv   # ruff and mypy as pyproject.toml configures them (pinned in the dev extra)
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/mypy

docs: venv
	$(PY) -m sweep.docs_gen   # docs/reference/*.md from the code

clean:
	rm -rf $(VENV) results .pytest_cache
