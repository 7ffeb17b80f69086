# fenced_lock — build, demo, tests, packages, benchmarks.
#   make demo              build + install, start a scratch PostgreSQL on loopback, run the inventory story
#   make test              every suite on the default major (PostgreSQL 15): lint, unit, pgrx, pg_regress,
#                          isolation, integration, faults, upgrade, bench smoke (make test-pg), then the
#                          client libraries' suites, the network partitions and a 3-minute soak (make test-beside)
#   make test PG=17        the same on another major (13-18; scripts/pg-majors.sh fetches it)
#   make test-all-majors   pgrx, pg_regress, isolation and update tests on 13, 14, 16, 17, 18, and the
#                          integration and fault suites on 18
#   make test-ha           fenced_lock under Patroni failover and partitions (tests/ha/README.md)
#   make soak DURATION=1h  every fault at once for an hour, judged by an independent checker (tests/soak/README.md)
#   make package           .deb and tarball per major (target/packages/); make test-package installs
#                          each into a clean server of its major and runs the regress suite
#   make ci                what CI runs: all of the above (test-beside beside test-all-majors)
#   make test-clients      the client libraries' suites and conformance examples (clients/README.md)
#   make package-clients   a package of each client library (target/packages/clients/)
#   make bench             fenced_lock beside its baselines and peers, with the speed targets (bench/README.md; ~30 min)
# Run as root on Debian bookworm (scripts/prereqs.sh installs what is missing).

PG        ?= 15
MAJORS    ?= 13 14 15 16 17 18
PYTHON    ?= /usr/bin/python3
WITH_PG    = bash scripts/with-pg.sh $(PG)
PYTEST     = $(PYTHON) -m pytest -q -p no:cacheprovider
DURATION  ?= 3m

.PHONY: all prereqs build install demo test test-pg test-major test-all-majors test-unit test-pgrx test-regress \
        test-isolation test-integration test-faults test-upgrade test-upgrade-major test-ha package test-package ci \
        test-clients client-suites package-clients test-network test-soak-checker soak test-beside \
        bench bench-smoke fmt lint clean

all: install

prereqs:
	bash scripts/prereqs.sh

build:
	cargo build --release

# Into the major's server (and, for 14+, also into its whole install, on
# which the Python suites run).
install:
	$(WITH_PG) sh -c 'cargo pgrx install --release --pg-config "$$PG_CONFIG" --no-default-features --features pg$(PG) && \
	  if [ -n "$$PG_FULL_CONFIG" ] && [ "$$PG_FULL_CONFIG" != "$$PG_CONFIG" ]; then \
	    cargo pgrx install --release --pg-config "$$PG_FULL_CONFIG" --no-default-features --features pg$(PG); fi' >/dev/null

demo: prereqs install
	bash scripts/demo.sh

test: test-pg test-beside
	@echo "all suites, the client libraries, the partitions and a short soak passed on PostgreSQL $(PG)"

# Every suite of the extension on one major (what `test` runs before the clients).
test-pg: prereqs lint test-unit test-pgrx install test-regress test-isolation test-integration test-faults test-upgrade bench-smoke
	@echo "all suites passed on PostgreSQL $(PG)"

# What every major gets in test-all-majors.
test-major: test-pgrx install test-regress test-isolation test-upgrade-major
	@echo "pgrx, pg_regress, isolation and update tests passed on PostgreSQL $(PG)"

test-all-majors: prereqs
	for m in 13 14 16 17 18; do $(MAKE) --no-print-directory test-major PG=$$m || exit 1; done
	$(MAKE) --no-print-directory test-integration test-faults PG=18
	@echo "all majors passed"

test-unit:
	cargo test --lib -- --skip tests::pg_

# pgrx's in-process tests; they install a test build, so `install` runs after them.
test-pgrx:
	$(WITH_PG) sh -c 'd=/tmp/fenced_lock_pgrx_$(PG); mkdir -p $$d && chown postgres:postgres $$d && \
	  cargo pgrx test pg$(PG) --runas postgres --pgdata $$d'

test-regress:
	$(WITH_PG) bash scripts/test-regress.sh

test-isolation:
	$(WITH_PG) bash scripts/test-isolation.sh

# Two workers, a test module each at a time (most tests wait on timers and
# other sessions; the conftest gives each worker its own clusters).
test-integration:
	$(WITH_PG) $(PYTEST) -n 2 --dist loadfile tests/integration

test-faults:
	$(WITH_PG) $(PYTEST) tests/faults

# Updates: from the real 0.1.0 (built from its tag) on 15; on every major,
# the update script must give the objects a fresh install gives, and a hot
# standby refuses lease changes with 25006.
test-upgrade:
	$(WITH_PG) $(PYTEST) tests/upgrade

test-upgrade-major:
	$(WITH_PG) $(PYTEST) tests/upgrade -k "catalog or standby"

# Network partitions on loopback (iptables; root), keepalive settings measured.
test-network:
	$(WITH_PG) $(PYTEST) tests/network

# The soak's checker on planted violations (no server).
test-soak-checker:
	$(PYTEST) tests/soak

# Every fault mixed at random for DURATION (3m in CI and make test; 1h for
# the long run), judged by tests/soak/checker.py.
soak:
	$(WITH_PG) bash scripts/soak.sh $(DURATION)

# Patroni + etcd failover suite (tests/ha/README.md); needs the extension installed.
test-ha:
	$(PYTEST) tests/ha

# The client libraries against a scratch server with the extension of PG (clients/README.md).
test-clients: install client-suites

# The suites alone, on the extension already installed (ci runs them beside
# test-all-majors, whose builds must not be raced by another install).
client-suites:
	bash scripts/prereqs-clients.sh
	$(WITH_PG) bash scripts/test-clients.sh

package-clients:
	bash scripts/prereqs-clients.sh
	mkdir -p target/packages/clients
	for lang in python rust java go node; do bash clients/$$lang/package.sh target/packages/clients || exit 1; done

package:
	bash scripts/package.sh $(MAJORS)

test-package: package
	bash scripts/test-package.sh $(MAJORS)

# What mostly waits (client keepalives, partitions, the soak's faults) rather
# than compiles: CI runs it beside test-all-majors, whose builds it would
# otherwise wait for. On the extension already installed by test-pg.
test-beside: client-suites test-network test-soak-checker
	$(MAKE) --no-print-directory soak DURATION=$(DURATION)

ci: test-pg
	bash scripts/prereqs-clients.sh
	@set -e; log=/tmp/fenced_lock_tests/ci_beside.log; mkdir -p /tmp/fenced_lock_tests; \
	  ( $(MAKE) --no-print-directory test-beside > $$log 2>&1; echo $$? > $$log.rc ) & \
	  majors=0; $(MAKE) --no-print-directory test-all-majors || majors=$$?; wait; \
	  echo "== client suites, partitions, soak (run beside test-all-majors)"; cat $$log; \
	  [ $$majors -eq 0 ] && [ "$$(cat $$log.rc)" = 0 ]
	$(MAKE) --no-print-directory test-ha test-package
	@echo "CI passed"

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
