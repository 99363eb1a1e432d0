# The template's own tooling. `make demo` is the main job; `make test` runs every test.
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
DEMO_DIR ?= build/demo

help:  ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "Python 3.10+ is needed")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed  ## Create .venv with what template development needs

# One pytest worker per CPU (pytest-xdist), handed one test at a time: the longest tests start
# first (tests/conftest.py orders them), so that the others share the remaining workers. The 15
# longest are listed at the end, to see where a run's time went.
test: venv  ## Run all template tests: render every option, bake, install, run baked tests
	$(VENV)/bin/python -m pytest -n auto --dist load --maxschedchunk 1 --durations 15 $(PYTEST_ARGS)

lint: venv  ## Lint and format-check the template's own Python files
	$(VENV)/bin/python -m ruff check hooks tests benchmarks
	$(VENV)/bin/python -m ruff format --check hooks tests benchmarks

demo:  ## Bake with defaults into $(DEMO_DIR), install it in its own venv, train on the demo data
	bash scripts/demo.sh "$(DEMO_DIR)" "$(PYTHON)"

clean:  ## Remove the venv and the demo bake
	rm -rf $(VENV) build

.PHONY: help venv test lint demo clean
