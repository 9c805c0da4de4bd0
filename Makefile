# radic — top-level build. `make` builds everything; `make test`, `make bench`,
# `make demo`, `make check` and `make soak` are the entry points the README names.
#
# Each part may add a fragment under mk/ that appends to BUILD_TARGETS and
# defines its own build rules; this file owns only the shared targets.

SHELL      := /bin/bash
GO         ?= go
GOFLAGS    ?=
CC         ?= gcc
CWARN      := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS_APP := -O2 -g $(CWARN) -D_GNU_SOURCE
export GOFLAGS

BUILD_TARGETS :=

# Fragments of the parts (cluster, radicd, tests...) add to BUILD_TARGETS.
-include mk/*.mk

SHIM_SRC := $(wildcard shim/*.go shim/*.c shim/*.h shim/*.map)

.PHONY: all deps test bench demo check soak clean
all: lib/libradic.so bin/radicd bin/radic $(BUILD_TARGETS)

# The preload library: cgo, c-shared, netgo (no libc resolver from Go), and a
# version script so that only the interposed symbols are exported.
lib/libradic.so: $(SHIM_SRC) go.mod
	@mkdir -p lib
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -tags netgo -trimpath \
		-ldflags='-extldflags=-Wl,--version-script=$(CURDIR)/shim/libradic.map' \
		-o $@ ./shim
	@rm -f lib/libradic.h

# A deliberately broken shim used by the tests to prove they can see a fault:
# the read/recv trampolines drop one byte now and then.
lib/libradic-broken.so: $(SHIM_SRC) go.mod
	@mkdir -p lib
	CGO_ENABLED=1 CGO_CFLAGS='-O2 -g -DRADIC_FAULT_DROP_BYTES' $(GO) build -buildmode=c-shared -tags netgo -trimpath \
		-ldflags='-extldflags=-Wl,--version-script=$(CURDIR)/shim/libradic.map' \
		-o $@ ./shim
	@rm -f lib/libradic-broken.h

bin/%: FORCE
	@mkdir -p bin
	$(GO) build -trimpath -tags netgo -o $@ ./cmd/$*

FORCE:

deps:
	@scripts/deps.sh

# Tests: unit tests of every package (in parallel), then the system suites
# under test/, which use the artifacts built above, one package at a time:
# they start real daemons, clusters and MPI jobs, and timing-sensitive ones
# (failure detection, MPI on 2 cores) must not compete with each other.
TEST_TIMEOUT ?= 40m
test: deps all lib/libradic-broken.so
	@mkdir -p build
	set -o pipefail; { \
	  $(GO) test -shuffle=on -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v '/test/'); unit=$$?; \
	  $(GO) test -p 1 -shuffle=on -timeout $(TEST_TIMEOUT) ./test/...; system=$$?; \
	  [ $$unit = 0 ] && [ $$system = 0 ]; \
	} 2>&1 | tee build/test.log

bench: deps all
	@mkdir -p build
	RADIC_BENCH=1 $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./test/... 2>&1 | tee build/bench.log; exit $${PIPESTATUS[0]}

soak: deps all
	RADIC_SOAK=1 $(GO) test -timeout 120m ./test/... 2>&1 | tee build/soak.log; exit $${PIPESTATUS[0]}

demo: deps all
	@scripts/demo.sh

check: all
	@scripts/check.sh

clean:
	rm -rf lib bin build
