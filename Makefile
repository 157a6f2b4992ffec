# greenhouse-gateway: run `make help` for the targets.
SHELL := /usr/bin/env bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
BINARIES := gatewayd gatewayctl devicesim
TEST_TIMEOUT ?= 14m

.PHONY: help build run test test-short lint fmt vet fuzz dynamodb-local clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## build bin/gatewayd, bin/gatewayctl and bin/devicesim
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

dynamodb-local: ## install AWS DynamoDB Local into .cache/ (needs Java 17; installed with apt if missing)
	@deploy/local/dynamodb-local.sh install

run: build dynamodb-local ## run the gateway, DynamoDB Local, its tables and a few simulated devices; Ctrl-C stops all
	@deploy/local/run.sh

test: dynamodb-local lint ## run every test, integration tests included, with the race detector
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

test-short: ## unit tests only (no DynamoDB Local, no subprocesses)
	$(GO) test -short -count=1 ./...

lint: vet fmt ## go vet and gofmt

vet:
	$(GO) vet ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

FUZZTIME ?= 20s
fuzz: ## run every fuzz target for FUZZTIME each (default 20s)
	@for t in $$($(GO) test -list 'Fuzz.*' ./internal/contract/ | grep ^Fuzz); do \
		echo "== $$t"; $(GO) test -run XXX -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/contract/ || exit 1; \
	done

clean: ## remove build output and local run state (keeps the DynamoDB Local download)
	rm -rf bin .run
