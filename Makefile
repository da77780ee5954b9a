# Set-up and everyday targets. `make demo` and `make test` are all a new user needs.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.stamp

.PHONY: venv demo test test-poison lint browser clean distclean

venv: $(STAMP)

# torch is installed first with an exact pin (the CPU wheel pip finds on local disk), so that
# installing the package afterwards never pulls a different torch.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install torch==2.13.0
	$(VENV)/bin/pip install -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/autofusion demo

# One worker per core (pytest-xdist): the tests build C++ and wait on the compiler much of the time.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n auto

# The numerics, random-graph and runtime tests once more with every buffer generated code writes
# filled with NaN before each run: a kernel that leaves an element unwritten fails here.
POISON_TESTS := tests/codegen/test_kernel_numerics.py tests/codegen/test_reduction_numerics.py \
	tests/codegen/test_special_values.py tests/frontend/test_random_graphs.py \
	tests/passes/test_passes_random.py tests/passes/test_plan_acyclic.py tests/runtime/
test-poison: $(STAMP)
	AUTOFUSION_POISON=1 $(VENV)/bin/python -m pytest -n auto $(POISON_TESTS)

# Style and types (settings in pyproject.toml): ruff's lint rules, ruff's formatter, and mypy over
# src/autofusion. All three run, so one CI log shows every finding; the target fails if any found one.
lint: $(STAMP)
	status=0; \
	$(VENV)/bin/ruff check src tests || status=1; \
	$(VENV)/bin/ruff format --check src tests || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

# Optional: headless Chromium for the report's rendering test (tests/dfx/test_report.py skips without
# it). Debian/Ubuntu package; needs root. CI can run `make browser` before `make test`.
browser:
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .hypothesis .ruff_cache .mypy_cache .autofusion_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print -exec rm -rf {} +

# Also removes the virtual environment; the next target rebuilds it.
distclean: clean
	rm -rf $(VENV)
