# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test check bench bench-quality bench-batch

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,local,otel]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/webctx demo

# The whole suite: in parallel (each xdist worker has its own Redis database, see
# tests/conftest.py; integration tests mostly wait on worker processes, so more workers than
# cores pay off), then alone the few tests that assert timing (marker `serial`, 44 tests).
# The longest tests start first and each xdist_group stays on one worker (tests/scheduling.py).
# On a fresh clone on 2 otherwise quiet cores: 1,519 tests in 9:11-9:46, then the serial 44
# in 0:39 (12:53 with the install); the wall time follows the machine's other load.
TEST_WORKERS ?= 6
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -p no:cacheprovider

# Python's own bytecode cache stays on for the tests even where the environment turns it
# off (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of worker and CLI processes and
# each pytest worker rewrites every test module's asserts; compiled once, collection costs
# a third less CPU and every process start a little less.
test: install
	bash scripts/ensure-redis
	bash scripts/ensure-tools
	PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q -j 0 webctx workers api cli tests bench >/dev/null
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m "not serial"
	$(PYTEST) -m serial

check: install
	PY=$(PY) bash scripts/check

bench: install
	$(PY) bench/vector_store.py --write
	$(PY) bench/pipeline_job.py --write

# Batch throughput by worker count, cost per question as a batch grows, fairness and worker
# memory on the QA web (issue #12); uses Redis db 14 ($$WEBCTX_BENCH_REDIS_URL), flushed.
bench-batch: install
	bash scripts/ensure-redis
	$(PY) bench/batch_scaling.py --write

# Extraction F1/speed, answer recall per budget on two seeds with ranking variants, and
# citation checks (issue #11). A fresh clone embeds every QA page once with MiniLM (the
# bulk of the run); vectors are cached in bench/out/, so later runs skip that.
bench-quality: install
	$(PY) bench/extraction.py --variants --repeat 2 --write
	$(PY) bench/answer_recall.py --variants --engine --write
