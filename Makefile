# AdTally — the two commands: `make run` and `make test`.
SHELL := /bin/bash
SWIFT ?= swift

.PHONY: deps build build-release run test test-only test-citus screenshot bench-ingest bench-report bench-backlog bench-erase bench-scaling bench-mediation bench-client bench-citus fuzz

deps:
	@scripts/install-deps.sh

build: deps
	$(SWIFT) build

## build-release: the server and CLI, optimised (the Dockerfile builds with this
## target too, with SWIFT_BUILD_FLAGS=--static-swift-stdlib and ADTALLY_DEPS=build).
build-release: deps
	$(SWIFT) build -c release --product adtally $(SWIFT_BUILD_FLAGS)

## run: install what is missing, build, and serve on 127.0.0.1:8080 with the
## embedded PostgreSQL in .adtally/ (or DATABASE_URL when set).
run: build-release
	.build/release/adtally serve

## test: install what is missing and run the whole suite against a throwaway
## PostgreSQL that is started and stopped around it: the app-side kit's own tests
## (Clients/AdTallyKit), then the server's, which drive the kit's executables too,
## then test-citus where the Citus extension is installed (it says so when it skips).
## First, Prometheus's own tools on the operators' alert rules, and the kit's privacy
## manifest against its sources (scripts/privacy_manifest_check.py, Python's plistlib). At most TEST_WIDTH
## tests run at once: all ~230 at once on two cores starved each other past their
## own timeouts (a 20 s HTTP read, a 30 s commit) now and then.
TEST_WIDTH ?= 16
test: deps
	promtool check rules Dashboards/alerts.yml
	promtool test rules Dashboards/alerts.test.yml
	python3 scripts/privacy_manifest_check.py
	python3 scripts/privacy_manifest_check.py --self-test
	$(SWIFT) build --build-tests
	$(SWIFT) build --build-tests --package-path Clients/AdTallyKit
	$(SWIFT) test --skip-build --package-path Clients/AdTallyKit
	ADTALLY_KIT_BIN="$$($(SWIFT) build --package-path Clients/AdTallyKit --show-bin-path)" \
	SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH=$(TEST_WIDTH) \
	ADTALLY_BIN="$$($(SWIFT) build --show-bin-path)/adtally" scripts/with-test-postgres.sh scripts/test-summary.sh $(SWIFT) test --skip-build
	SWIFT="$(SWIFT)" ADTALLY_BIN="$$($(SWIFT) build --show-bin-path)/adtally" scripts/run-test-citus.sh --optional

## test-only: FILTER='DocsTests|ExportTests/demo' runs only the server's tests whose
## suite/test names match, on a throwaway PostgreSQL, with the kit's executables built
## for the tests that drive them: the quick loop while working on one part.
test-only: deps
	@test -n "$(FILTER)" || { echo "make test-only: give FILTER, e.g. make test-only FILTER=DocsTests" >&2; exit 2; }
	$(SWIFT) build --build-tests
	$(SWIFT) build --package-path Clients/AdTallyKit
	ADTALLY_KIT_BIN="$$($(SWIFT) build --package-path Clients/AdTallyKit --show-bin-path)" \
	SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH=$(TEST_WIDTH) \
	ADTALLY_BIN="$$($(SWIFT) build --show-bin-path)/adtally" scripts/with-test-postgres.sh $(SWIFT) test --skip-build --filter '$(FILTER)'

## test-citus: deploy/citus-setup.sql, placement, ingest, reports in four zones, money,
## mediation, the series, exports and maintenance on a throwaway three-node Citus
## cluster, each against one plain node with the same traffic. Needs Citus installed
## (DEVELOPERS.md); fails without it.
test-citus: deps
	$(SWIFT) build --build-tests
	SWIFT="$(SWIFT)" ADTALLY_BIN="$$($(SWIFT) build --show-bin-path)/adtally" scripts/run-test-citus.sh

## screenshot: docs/dashboard.png, made by the dashboard's browser test (headless
## Chromium against a server holding demo data); `make test` writes it to .build/.
screenshot: deps
	$(SWIFT) build --build-tests
	ADTALLY_SCREENSHOT="$(CURDIR)/docs/dashboard.png" ADTALLY_BIN="$$($(SWIFT) build --show-bin-path)/adtally" \
	  scripts/with-test-postgres.sh $(SWIFT) test --skip-build --filter 'DashboardTests/browser'

## bench-report: report latency over HTTP (p50/p99) and CSV export rate against plain PostgreSQL, on 10 M loaded events.
bench-report: build-release
	$(SWIFT) build -c release --product adtally-bench
	bench/report.sh

## bench-ingest: ingest rate, ack latency and server RSS against a raw COPY of the same rows.
bench-ingest: build-release
	$(SWIFT) build -c release --product adtally-bench
	bench/ingest.sh

## bench-erase: on the bench's 10 M loaded events, with ingest running at a steady rate: 1,000 devices
## of the largest app erased by one request (the job's wall time, the rows removed) and ingest's ack p99 meanwhile.
bench-erase: build-release
	$(SWIFT) build -c release --product adtally-bench
	bench/erase.sh

## bench-backlog: on the bench's 10 M loaded events, with ingest running at a steady rate:
## migration 0013's indexes built again (CONCURRENTLY) and a week of the largest app's
## deltas folded (passes, the longest, cut or failed ones); ingest's ack p99 and max in each.
bench-backlog: build-release
	$(SWIFT) build -c release --product adtally-bench
	bench/backlog.sh

## bench-scaling: the figures of docs/scaling.md: bytes per event (raw, ledger), rollups and
## sketches per app-month, COPY rows per core; extrapolated to 1 B events a month.
bench-scaling: build-release
	bench/scaling.sh

## bench-mediation: the mediation answer under keep-alive load (p50/p99, req/s) against a
## static file of the same bytes from the same server, the 304 revalidation, and devices
## asking with their ids without and with a running experiment (DESIGN §14).
bench-mediation: build-release
	bench/mediation.sh

## bench-client: AdTallyKit's record latency (p50/p99, persistence included), sustained events/s
## from one process to a local server, record latency while the server stalls (p99, max), and
## that process's RSS, against write(2) of a same-sized record.
bench-client: build-release
	bench/client.sh

## bench-citus: docs/scaling.md's Citus figures: ingest rate through the coordinator, the default
## report's p50 (one app: one worker), compaction passes, each against one plain node in the same run
## (a throwaway three-node cluster on this machine; needs Citus installed, DEVELOPERS.md).
bench-citus: build-release
	$(SWIFT) build -c release --product adtally-bench
	scripts/with-citus-cluster.sh scripts/with-test-postgres.sh bench/citus.sh

## fuzz: libFuzzer + AddressSanitizer on the ingest body readers and validator, on
## the CSV reader of adtally ingest, the money CSVs and the networks' report readers, and
## on AdTallyKit's readers of the network's answers (the batch receipt, the switch answer),
## FUZZ_SECONDS each (default 600). Not part of test.
fuzz: deps
	scripts/fuzz.sh
