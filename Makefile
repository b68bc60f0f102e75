# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test check bench bench-quality

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,local,otel]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/webctx demo

test: install
	bash scripts/ensure-redis
	$(PY) -m pytest -q -p no:cacheprovider

check: install
	$(PY) -m ruff check webctx workers api tests bench celeryconfig.py
	$(PY) -m mypy webctx workers api celeryconfig.py

bench: install
	$(PY) bench/vector_store.py --write
	$(PY) bench/pipeline_job.py --write

# Extraction F1/speed, answer recall per budget and citation checks (issue #11); vectors
# are cached in bench/out/, so only the first run embeds the QA pages.
bench-quality: install
	$(PY) bench/extraction.py --write
	$(PY) bench/answer_recall.py --write
