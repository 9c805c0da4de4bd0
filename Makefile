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

SHIM_C_SRC  := $(wildcard shim/c/*.c shim/c/*.h shim/c/*.map)
# The Go half is rebuilt when any package of this module it imports changes
# (observer/replayfile's format, say), not only shim/: a stale library
# refuses the replay files a new radicd writes.
SHIM_GO_DEPS := $(filter $(CURDIR)/%,$(shell $(GO) list -deps -f \
	'{{if not .Standard}}{{$$d := .Dir}}{{range .GoFiles}}{{$$d}}/{{.}} {{end}}{{range .CgoFiles}}{{$$d}}/{{.}} {{end}}{{end}}' ./shim 2>/dev/null))
SHIM_GO_SRC := $(sort $(wildcard shim/*.go shim/*.c shim/*.h shim/*.map shim/wire/*.go) $(wildcard shim/c/*.h) $(SHIM_GO_DEPS))

.PHONY: all deps test bench demo check soak clean
all: lib/libradic.so lib/libradic-go.so bin/radicd bin/radic $(BUILD_TARGETS)

# The preload library is two: lib/libradic.so, plain C (the trampolines, the
# fd table, the safe sockets' data path), is what LD_PRELOAD names; it loads
# lib/libradic-go.so, the Go control plane (cgo, c-shared, netgo: no libc
# resolver from Go), only in a process that is to be managed (RADIC_JOB or
# RADIC_TEST_MANAGE=1). Version scripts keep everything else local.
# -Bsymbolic binds the library's own references to its own definitions at
# link time (the radic_* tables, radic_resolve, the wrappers calling each
# other), so the loader does not look them up again in every process it
# starts: 12 fewer symbol lookups, 6.5k fewer instructions per preloaded
# /bin/true (callgrind).
SHIM_CFLAGS  := -O2 -g -fPIC -fno-semantic-interposition $(CWARN) -D_GNU_SOURCE
SHIM_LDFLAGS := -shared -Wl,-soname,libradic.so -Wl,--version-script=$(CURDIR)/shim/c/libradic.map \
		-Wl,-Bsymbolic -ldl -pthread

lib/libradic.so: $(SHIM_C_SRC) Makefile
	@mkdir -p lib
	$(CC) $(SHIM_CFLAGS) -o $@ $(filter %.c,$^) $(SHIM_LDFLAGS)

# A deliberately broken shim used by the tests to prove they can see a fault:
# the read/recv trampolines drop one byte now and then. It loads the same
# lib/libradic-go.so (beside it), which binds to it by its soname.
lib/libradic-broken.so: $(SHIM_C_SRC) Makefile
	@mkdir -p lib
	$(CC) $(SHIM_CFLAGS) -DRADIC_FAULT_DROP_BYTES -o $@ $(filter %.c,$^) $(SHIM_LDFLAGS)

lib/libradic-go.so: $(SHIM_GO_SRC) lib/libradic.so go.mod
	@mkdir -p lib
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -tags netgo -trimpath \
		-ldflags='-extldflags=-Wl,--version-script=$(CURDIR)/shim/libradic-go.map' \
		-o $@ ./shim
	@rm -f lib/libradic-go.h

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
# Then the ring and recovery tests of radicd again with the daemons on the
# emulated Blue Gene torus (radicd --fabric bg; the suite above runs them
# on the default, ip).
TEST_TIMEOUT ?= 40m
BG_TESTS ?= TestKillDetection|TestLongFreezeDetected|TestShortFreezeNoFalsePositive|TestShortCutNoFalsePositive|TestCutLinkSavedByIndirectProbes|TestIsolatedNodeFencesItsJob|TestQuickRestartIsDetected|TestReaddress|TestSimultaneousReaddress|TestRestartLostRank|TestFenceIsNotACrash|TestReplayStream$$|TestRecoveryCampaign
test: deps all lib/libradic-broken.so
	@mkdir -p build
	set -o pipefail; { \
	  $(GO) test -shuffle=on -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v '/test/'); unit=$$?; \
	  $(GO) test -p 1 -shuffle=on -timeout $(TEST_TIMEOUT) ./test/...; system=$$?; \
	  RADIC_TEST_FABRIC=bg $(GO) test -shuffle=on -timeout $(TEST_TIMEOUT) -run '$(BG_TESTS)' ./test/radicd; bg=$$?; \
	  [ $$unit = 0 ] && [ $$system = 0 ] && [ $$bg = 0 ]; \
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
