# greenhouse-gateway: run `make help` for the targets.
SHELL := /usr/bin/env bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
BINARIES := gatewayd gatewayctl devicesim
TEST_TIMEOUT ?= 14m
CI_FUZZTIME ?= 3s

.PHONY: help build run smoke test test-deps test-short lint fmt vet fuzz dynamodb-local clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## build bin/gatewayd, bin/gatewayctl and bin/devicesim
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

dynamodb-local: ## install AWS DynamoDB Local into .cache/ (needs Java 17; installed with apt if missing)
	@deploy/local/dynamodb-local.sh install

# UPLINK=lambda: the uplink invokes the readings function under the Runtime
# Interface Emulator (built into .cache/bin, as harness/lambdatest does).
# RUN_FOR=60s: the run stops by itself after that long.
UPLINK ?= dynamodb
RUN_FOR ?=
RIE_VERSION ?= v0.0.0-20261030222936-bef5c4ba774d
RIE_BIN := $(CURDIR)/.cache/bin/aws-lambda-rie-$(RIE_VERSION)/aws-lambda-rie
run: build dynamodb-local $(if $(filter lambda,$(UPLINK)),lambda-local) ## run the gateway, DynamoDB Local, its tables and a few simulated devices (UPLINK=lambda: through the readings function under the Lambda emulator; RUN_FOR=60s: stop after that long); Ctrl-C stops all
	@UPLINK='$(UPLINK)' RUN_FOR='$(RUN_FOR)' $(if $(filter lambda,$(UPLINK)),RIE_BIN='$(RIE_BIN)') deploy/local/run.sh

smoke: ## make run, checked from outside: waits for every simulated device's readings in DynamoDB Local (read with awscli), stops it as Ctrl-C does, checks that nothing is left running (UPLINK=lambda too)
	@UPLINK='$(UPLINK)' deploy/local/smoke.sh

.PHONY: lambda-local
lambda-local: lambda ## the readings function, the Lambda Runtime Interface Emulator (.cache/bin) and bin/invokeproxy, for make run UPLINK=lambda
	@GOBIN=$(CURDIR)/.cache/bin/aws-lambda-rie-$(RIE_VERSION) $(GO) install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$(RIE_VERSION) || \
		{ echo "make: could not build the Lambda Runtime Interface Emulator $(RIE_VERSION) through the Go module proxy ($$($(GO) env GOPROXY)); go's message is above: check the network or GOPROXY, then run again" >&2; exit 1; }
	$(GO) build -trimpath -o bin/invokeproxy ./harness/invokeproxy/cmd/invokeproxy

test: dynamodb-local test-deps lint verify-forks ## every test, integration and 3-minute soak included, with the race detector; then each fuzz target briefly
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	@# Tests that measure the production build (race instrumentation changes what they measure).
	$(GO) test -count=1 -run '^TestIdleConnectionStacksShrink$$' ./gateway/broker/
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(CI_FUZZTIME)

.PHONY: verify-forks
verify-forks: ## check that the forks in third_party/ are their upstream modules with the series of third_party/patches/ applied, and run the series' upstream regression tests
	@GO='$(GO)' third_party/verify.sh

test-deps: ## install (as root, in one apt run) the Debian packages the integration tests use
	@deploy/local/test-deps.sh

test-short: ## unit tests only (no DynamoDB Local, no subprocesses)
	$(GO) test -short -count=1 ./...

lint: vet fmt ## go vet and gofmt

vet:
	$(GO) vet ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

FUZZTIME ?= 20s
FUZZ_SHORT_TIME ?= 5s
# Every package with a fuzz target (func FuzzXxx in a _test.go file).
FUZZ_PKGS ?= $(sort $(dir $(shell grep -rlE --include='*_test.go' --exclude-dir=.cache --exclude-dir=.git '^func Fuzz[A-Z]' .)))
fuzz: ## run every fuzz target of every package for FUZZTIME each (default 20s)
	@GO=$(GO) FUZZTIME=$(FUZZTIME) deploy/local/fuzz.sh $(FUZZ_PKGS)

.PHONY: fuzz-short
fuzz-short: ## every fuzz target for FUZZ_SHORT_TIME each (default 5s), a quick check for CI
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZ_SHORT_TIME)

# The readings function (cmd/function) for AWS Lambda, runtime provided.al2023.
LAMBDA_ARCH ?= $(shell $(GO) env GOHOSTARCH)
.PHONY: lambda
lambda: ## build the readings function: bin/lambda/bootstrap and bin/lambda/function.zip (LAMBDA_ARCH=arm64|amd64, default the host's)
	@case '$(LAMBDA_ARCH)' in arm64|amd64) ;; *) echo "LAMBDA_ARCH: '$(LAMBDA_ARCH)' is not arm64 or amd64" >&2; exit 2;; esac
	@mkdir -p bin/lambda
	CGO_ENABLED=0 GOOS=linux GOARCH=$(LAMBDA_ARCH) $(GO) build -trimpath -tags lambda.norpc -ldflags '-s -w' -o bin/lambda/bootstrap ./cmd/function
	$(GO) run ./deploy/lambdazip bin/lambda/function.zip bin/lambda/bootstrap

clean: ## remove build output and local run state (keeps the DynamoDB Local download)
	rm -rf bin .run dist

# Release binaries and Debian packages: deploy/package/build.sh, output in dist/.
ARCHES ?= amd64 arm64 armhf
.PHONY: release package
release: ## cross-compile gatewayd, gatewayctl, devicesim for linux ARCHES (amd64 arm64 armhf) into dist/
	@VERSION='$(VERSION)' GO='$(GO)' deploy/package/build.sh release $(ARCHES)

package: ## Debian packages dist/greenhouse-gateway_*_ARCH.deb for ARCHES (nfpm v2.45.2)
	@VERSION='$(VERSION)' GO='$(GO)' deploy/package/build.sh package $(ARCHES)

# Benchmarks, not part of CI: go run ./cmd/bench -h lists BENCH_FLAGS.
BENCH_FLAGS ?=
.PHONY: bench
bench: dynamodb-local ## benchmarks against same-run baselines (mosquitto, SDK loop); a table, and .cache/bench/results.json (ignored)
	$(GO) run ./cmd/bench $(BENCH_FLAGS)
.PHONY: attack
ATTACK_TIMEOUT ?= 40m
attack: dynamodb-local test-deps ## the attack tests, and the full-disk cycles, at full size (thousands of sockets, RSS bounds, 10 disk cycles; figures in cmd/bench/MEASUREMENTS.md)
	GATEWAY_ATTACK_FULL=1 $(GO) test -count=1 -v -run '^(TestAttack|TestFullDiskCycles)' -timeout $(ATTACK_TIMEOUT) ./cmd/gatewayd/ ./gateway/...
soak: build dynamodb-local ## fault soak of bin/gatewayd (and bin/devicesim): kill -9, DynamoDB Local outages, fault proxy, SIGTERM, power cuts (FUSE, as root), then an hour of 100 devices with flat RSS peaks; SOAK_FLAGS (e.g. --duration 30m --kill-cycles 300 --powercut-cycles 100 --steady-duration 2h)
	$(GO) run ./cmd/soak --bin-dir bin $(SOAK_FLAGS)
