#!/usr/bin/env bash
# `make check`: static checks. Fails on the first class of problem found,
# after printing all of that class.
set -uo pipefail
cd "$(dirname "$0")/.."
fail=0
step() { printf '== %s\n' "$*"; }

step "gofmt"
bad=$(gofmt -l $(git ls-files '*.go') 2>&1)
[[ -z $bad ]] || { echo "gofmt would change:"; echo "$bad"; fail=1; }

step "go vet"
go vet ./... || fail=1

step "go mod tidy -diff"
go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; fail=1; }

step "staticcheck"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... || fail=1

step "C warnings as errors (shim and C programs)"
# libradic.so's C (shim/c) is compiled by the Makefile with -Werror, the Go
# half's C by cgo with -Wall -Wextra -Werror (shim/gate.go), the C programs
# by the Makefile with CFLAGS_APP. Rebuild all three from scratch.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
${CC:-gcc} -O2 -fPIC -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -shared \
  -o "$tmp/libradic.so" shim/c/*.c -ldl -pthread || fail=1
CGO_ENABLED=1 go build -a -buildmode=c-shared -tags netgo -o "$tmp/libradic-go.so" ./shim || fail=1
for f in $(git ls-files 'test/*.c'); do
  case $f in
    test/mpi/*) cc=mpicc.openmpi ;;
    *) cc=${CC:-gcc} ;;
  esac
  $cc -O2 -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -fsyntax-only "$f" || fail=1
done

if ((fail)); then echo "check: FAILED"; exit 1; fi
echo "check: all clean"
