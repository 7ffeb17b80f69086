# fenced_lock — build, demo, tests, benchmarks.
#   make demo    build + install, start a scratch PostgreSQL on loopback, run the inventory story
#   make test    every suite: unit, pgrx, pg_regress, isolation, integration, faults, bench smoke
#   make bench   fenced_lock beside its baselines and peers, with the speed targets (bench/README.md)
# Run as root on Debian bookworm (scripts/prereqs.sh installs what is missing).

PG_CONFIG ?= /usr/bin/pg_config
PYTHON    ?= /usr/bin/python3
PGRX_DATA ?= /tmp/fenced_lock_pgrx
export PATH := /usr/lib/postgresql/15/bin:$(PATH)

.PHONY: all prereqs build install demo test test-unit test-pgrx test-regress test-isolation \
        test-integration test-faults test-ha bench bench-smoke fmt lint clean

all: install

prereqs:
	bash scripts/prereqs.sh

build:
	cargo build --release

install:
	cargo pgrx install --release --pg-config $(PG_CONFIG)

demo: prereqs install
	bash scripts/demo.sh

test: prereqs test-unit test-pgrx install test-regress test-isolation test-integration test-faults bench-smoke
	@echo "all suites passed"

test-unit:
	cargo test --lib -- --skip tests::pg_

# pgrx's in-process tests; installs a test build, so `install` must run after it.
test-pgrx:
	mkdir -p $(PGRX_DATA) && chown postgres:postgres $(PGRX_DATA)
	cargo pgrx test pg15 --runas postgres --pgdata $(PGRX_DATA)

test-regress:
	bash scripts/test-regress.sh

test-isolation:
	bash scripts/test-isolation.sh

test-integration:
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

test-faults:
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/faults

# Patroni + etcd failover suite (tests/ha/README.md); needs the extension installed.
test-ha:
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/ha

bench: prereqs install
	bash bench/run.sh

bench-smoke:
	FL_BENCH_SMOKE=1 bash bench/run.sh

fmt:
	cargo fmt

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

clean:
	cargo clean
