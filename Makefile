# backstop: `make test` and `make demo` are the two commands a newcomer needs;
# `make help` lists every target with its `## target: what it does` comment.
GO        ?= go
PYTHON    ?= python3
WASM      := contract/backstop.wasm
# The Node.js and Python packages ship their own copies of the module and of
# the queue scripts (contract/scripts is the source). The copies are not
# committed: this target refreshes them for the tests, and the packages' own
# build hooks (sdk/node/copy-assets.js as npm's `prepare`,
# sdk/python/setup.py) make them for installs, npm pack and wheels.
WASM_COPIES := sdk/node/backstop.wasm sdk/python/src/backstop/backstop.wasm
SCRIPT_COPIES := sdk/node/scripts sdk/python/src/backstop/scripts
VENV      := .venv
VPY       := $(VENV)/bin/python
# The Python host runs on the wasmtime releases its fast path is proven on
# (sdk/python/pyproject.toml allows exactly those): make test runs its
# suite on the newest, in .venv (which the cross-host tests use too), and on
# the oldest, in .venv-wasmtime-oldest.
WASMTIME_NEWEST := 50.0.1
WASMTIME_OLDEST := 48.0.0
VENV_OLDEST := .venv-wasmtime-oldest
VPY_OLDEST  := $(VENV_OLDEST)/bin/python
# Each virtualenv's stamp names its wasmtime, so a new pin reinstalls.
PY_NEWEST := $(VENV)/.wasmtime-$(WASMTIME_NEWEST)
PY_OLDEST := $(VENV_OLDEST)/.wasmtime-$(WASMTIME_OLDEST)
# The Python tests that call the module in every way, run once more on each
# wasmtime with the fast path off (test_wasmtime compares the command's
# answers on both paths; the queue tests add no call of their own).
PY_CALL_TESTS := $(addprefix sdk/python/tests/,test_vectors.py test_inputs.py test_instance.py test_policy.py \
	test_retry.py test_wasmtime.py test_outcomes.py)
# -buildvcs=false and -trimpath keep the module byte-for-byte reproducible,
# so CI can check that the committed backstop.wasm matches its sources.
GOFLAGS_WASM := -buildmode=c-shared -trimpath -buildvcs=false -ldflags=-s
FUZZTIME  ?= 30s

.PHONY: all help build contract wasm deps test vectors queue-cases idempotency-cases rabbitmq-cases layers-cases bench fuzz demo clean

# apt-get needs root; CI and these machines run as root, elsewhere sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

all: build

## help: list the targets and what each does (these comments)
help:
	@awk '/^## [a-z-]+:/ { sub(/^## /, ""); n = index($$0, ":"); \
		printf "%s  %-18s%s\n", (seen++ ? "\n" : ""), substr($$0, 1, n - 1), substr($$0, n + 2); next } \
		/^## / { sub(/^## ?/, ""); printf "  %-18s%s\n", "", $$0 }' $(firstword $(MAKEFILE_LIST))

## demo: queues, workers deciding through backstop.wasm, the exporter on
## :9797 and a live view, with nothing to install (see `backstop demo -h`)
# Built, then run (not `go run`, which exits 1 on Ctrl-C whatever the demo
# returns): Ctrl-C ends the demo with its summary and no make error.
demo:
	@echo "make demo: compiling bin/backstop (the first time takes about a minute; then it starts at once)..."
	@$(GO) build -ldflags '$(LDFLAGS)' -o bin/backstop ./cmd/backstop
	bin/backstop demo

## contract: generate every language's bindings of contract/abi.json (the ABI,
## the failure, decision and outcome shapes) and wasm/ABI.md's tables
contract:
	$(GO) run ./internal/contractgen

## wasm: build the policy core into contract/backstop.wasm (embedded by the Go host)
wasm:
	GOOS=wasip1 GOARCH=wasm $(GO) build $(GOFLAGS_WASM) -o $(WASM) ./wasm
	for f in $(WASM_COPIES); do cp $(WASM) $$f; done
	for d in $(SCRIPT_COPIES); do mkdir -p $$d && cp contract/scripts/*.lua contract/scripts/*.sql $$d/ && cp contract/errorkinds.json $$d/../; done

VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/prometheus/common/version.Version=$(VERSION) -X main.version=$(VERSION)

## build: the wasm module and the commands (backstop, backstop-exporter) into bin/
build: wasm
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ ./cmd/...

## deps: install what the tests need: Go modules; two virtualenvs with the
## Python host and pytest (.venv with the newest wasmtime it allows,
## .venv-wasmtime-oldest with the oldest); Debian packages redis-server (queue
## tests against a real Redis and Redis Cluster), prometheus (promtool, and
## the server for the end-to-end alert test), prometheus-alertmanager and
## rabbitmq-server (the tests start their own brokers from
## /usr/lib/rabbitmq/bin, as plain processes with private data directories,
## never the system service; the management plugin is enabled per broker),
## postgresql (the idempotency store's PostgreSQL backend: the tests initdb a
## private data directory and start postgres from /usr/lib/postgresql/*/bin
## on a free loopback port, as the system user postgres when run as root).
## The Node.js host has no runtime dependencies; its tests install ioredis
## and redis (npm ci). The JVM host (sdk/java) needs a JDK and Maven
## (default-jdk-headless, maven), which fetches its dependencies itself.
## tmux runs internal/integration/walk, the README's quick start in a terminal.
deps: $(PY_NEWEST) $(PY_OLDEST)
	$(GO) mod download
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing="$$missing rabbitmq-server"; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v javac >/dev/null || missing="$$missing default-jdk-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(PY_NEWEST) $(PY_OLDEST): sdk/python/pyproject.toml
	rm -f $(@D)/.wasmtime-*
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install -q --upgrade pip
	$(@D)/bin/python -m pip install -q -e 'sdk/python[test]' 'wasmtime==$(patsubst .wasmtime-%,%,$(@F))'
	touch $@

## test: everything CI runs (installs what it needs first). The Python suite
## runs on the newest and the oldest wasmtime, each checking that a compiled-
## module cache entry the other wrote is never loaded; then PY_CALL_TESTS run
## again on both with the fast path off (wasmtime's public API only).
test: deps wasm
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "not gofmt-formatted (run gofmt -w): $$bad" >&2; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./wasm
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race ./host/...
	cd sdk/node && npm ci --no-audit --no-fund --loglevel=error && node --test
	BACKSTOP_OTHER_PYTHON=$(CURDIR)/$(VPY_OLDEST) $(VPY) -m pytest -q sdk/python/tests
	BACKSTOP_OTHER_PYTHON=$(CURDIR)/$(VPY) $(VPY_OLDEST) -m pytest -q sdk/python/tests
	BACKSTOP_OTHER_PYTHON=$(CURDIR)/$(VPY_OLDEST) BACKSTOP_FAST_PATH=0 $(VPY) -m pytest -q $(PY_CALL_TESTS)
	BACKSTOP_OTHER_PYTHON=$(CURDIR)/$(VPY) BACKSTOP_FAST_PATH=0 $(VPY_OLDEST) -m pytest -q $(PY_CALL_TESTS)
	$(MAKE) --no-print-directory java-test

## java-test: the JVM host (sdk/java, Maven, Java 17): its tests (the RabbitMQ
## and Redis workers' against a real rabbitmq-server and redis-server the tests
## start), then its jar and target/lib (java -jar sdk/java/target/backstop-policy.jar decide),
## which internal/integration/crosshost also builds and runs beside Go, Node.js and Python;
## then backstop-spring (sdk/java-spring, Spring Boot 4) over the installed core: its
## notification-service scenario against a real rabbitmq-server and the backstop command
.PHONY: java-test java-deps
java-test: java-deps
	mvn -B -q -f sdk/java/pom.xml install
	mvn -B -q -f sdk/java-spring/pom.xml package

## java-deps: the Debian packages java-test needs, installed when missing
java-deps:
	@missing=""; \
	command -v javac >/dev/null || missing="$$missing default-jdk-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing="$$missing rabbitmq-server"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

## mixin: regenerate mixin/mixin.libsonnet, the rules and dashboards as a
## monitoring mixin (a test renders it with go-jsonnet and compares)
.PHONY: mixin
mixin:
	$(GO) test -count=1 -run '^TestShippedMixinIsGenerated$$' ./mixin -update

## vectors: regenerate testdata/vectors and testdata/outcomes from the native core
vectors:
	$(GO) run ./internal/vector/gen -o testdata/vectors/vectors.json -outcomes testdata/outcomes/cases.json

## queue-cases: regenerate testdata/queue/cases.json: the cases' inputs
## (queue/redisqueue/cases_build_test.go) run through the Go worker against a real
## redis-server give the expected states
queue-cases:
	$(GO) test -count=1 -run '^TestQueueCases$$' ./queue/redisqueue -update

## idempotency-cases: regenerate testdata/idempotency/cases.json (the cases'
## steps, idempotency/cases_build_test.go, run through the Go store against a
## real redis-server give the expected replies and records) and requests.json
## (the request hash the Go middleware stores for each request target)
idempotency-cases:
	$(GO) test -count=1 -run '^(TestIdempotencyCases|TestRequestHashes)$$' ./idempotency -update

## rabbitmq-cases: regenerate testdata/rabbitmq/cases.json: the cases' inputs
## (queue/rabbitmq/cases_build_test.go) run through the Go worker against a
## real rabbitmq-server give where every message goes
rabbitmq-cases:
	$(GO) test -count=1 -run '^TestRabbitCases$$' ./queue/rabbitmq -update

## layers-cases: regenerate testdata/layers/cases.json: the cases' inputs
## (retry/layers_build_test.go) run through the Go loop and middleware with
## real HTTP servers on loopback give what each layer did
layers-cases:
	$(GO) test -count=1 -run '^TestLayerCases$$' ./retry -update

## bench: the side-by-side benchmarks, Go, Node.js, Python and Java (results go into BENCHMARKS.md)
bench: deps wasm
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./bench/... ./host/...
	cd bench/node && npm ci --no-audit --no-fund && node bench.js
	$(VPY) -m pip install -q -r bench/python/requirements.txt
	$(VPY) bench/python/bench.py
	mvn -B -q -f sdk/java/pom.xml -DskipTests install
	mvn -B -q -f bench/java/pom.xml package
	java -jar bench/java/target/benchmarks.jar

## fuzz: run each fuzz target for FUZZTIME (the seed corpora run in `make test`);
## the queue targets run the scripts on fuzzed entries, members and ARGV against a
## real redis-server (one per fuzzing process; `make deps` installs it)
fuzz: wasm
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./policy
	$(GO) test -run '^$$' -fuzz '^FuzzSubset$$' -fuzztime $(FUZZTIME) ./policy
	$(GO) test -run '^$$' -fuzz '^FuzzDuration$$' -fuzztime $(FUZZTIME) ./policy
	$(GO) test -run '^$$' -fuzz '^FuzzDecide$$' -fuzztime $(FUZZTIME) ./policy
	for f in FuzzPolicyLoad FuzzDecide FuzzDecideBatch FuzzBuffer; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) ./wasm || exit 1; done
	for f in FuzzScriptEntries FuzzScriptMembers FuzzScriptArgs; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) ./queue/redisqueue || exit 1; done

clean:
	rm -rf bin $(VENV) $(VENV_OLDEST)
