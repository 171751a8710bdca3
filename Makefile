# backstop: `make test` and `make demo` are the two commands a newcomer needs.
GO        ?= go
WASM      := host/backstop.wasm
# -buildvcs=false and -trimpath keep the module byte-for-byte reproducible,
# so CI can check that the committed backstop.wasm matches its sources.
GOFLAGS_WASM := -buildmode=c-shared -trimpath -buildvcs=false -ldflags=-s
FUZZTIME  ?= 30s

.PHONY: all build wasm deps test vectors bench fuzz clean

# apt-get needs root; CI and these machines run as root, elsewhere sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

all: build

## wasm: build the policy core into host/backstop.wasm (embedded by the Go host)
wasm:
	GOOS=wasip1 GOARCH=wasm $(GO) build $(GOFLAGS_WASM) -o $(WASM) ./wasm

## build: the wasm module and the commands into bin/
build: wasm
	$(GO) build -trimpath -o bin/ ./cmd/...

## deps: install what the tests need: Go modules, and redis-server (Debian
## package) for the queue tests against a real Redis and Redis Cluster.
deps:
	$(GO) mod download
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
		echo "installing redis-server (Debian package)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }

## test: everything CI runs (installs what it needs first)
test: deps wasm
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./wasm
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race ./host/...

## vectors: regenerate testdata/vectors from the native core
vectors:
	$(GO) run ./internal/vector/gen -o testdata/vectors/vectors.json

## bench: the side-by-side benchmarks (results go into BENCHMARKS.md)
bench: wasm
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./bench/... ./policy/... ./host/...

## fuzz: run each fuzz target for FUZZTIME (the seed corpora run in `make test`)
fuzz: wasm
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./policy
	$(GO) test -run '^$$' -fuzz '^FuzzDecide$$' -fuzztime $(FUZZTIME) ./policy
	for f in FuzzPolicyLoad FuzzDecide FuzzDecideBatch FuzzBuffer; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) ./wasm || exit 1; done

clean:
	rm -rf bin
