# walcount's build. `make test` is what CI runs (see .ci/run).

GO ?= go
BIN = bin/walcount

.PHONY: all build deps test lint demo bench clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/walcount

# deps installs (as root) or names what the tests need: PostgreSQL >= 14
# server binaries, redis-server and promtool.
deps:
	sh scripts/ensure-deps.sh

test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 40m ./...

lint:
	@files=$$(gofmt -l .); \
	if [ -n "$$files" ]; then echo "gofmt -l found unformatted files:"; echo "$$files"; exit 1; fi
	$(GO) vet ./...

# demo runs walcount against throwaway servers under load and verifies every
# count; pass flags with DEMO_FLAGS, e.g. make demo DEMO_FLAGS="--duration 1m".
demo: deps build
	./$(BIN) demo $(DEMO_FLAGS)

# bench measures walcount against the alternatives on this machine (about 10
# minutes) and writes bench/results/; QUICK=1 makes it a short run (-quick,
# about a minute). Pass more flags with BENCH_FLAGS (go run ./bench -h).
bench: deps build
	@quick=; if [ -n "$(QUICK)" ] && [ "$(QUICK)" != 0 ]; then quick=-quick; fi; \
	echo "$(GO) run ./bench $$quick $(BENCH_FLAGS)"; \
	$(GO) run ./bench $$quick $(BENCH_FLAGS)

clean:
	rm -rf bin
