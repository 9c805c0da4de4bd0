#!/usr/bin/env bash
# Installs what radic's build, tests and demo need, when it is missing.
# As root it uses apt-get; otherwise it prints exactly what to install and fails.
set -euo pipefail

# Debian packages and, for each, a file that shows it is installed.
pkgs=(
  gcc:/usr/bin/gcc
  make:/usr/bin/make
  openmpi-bin:/usr/bin/orterun
  libopenmpi-dev:/usr/bin/mpicc.openmpi
  mpich:/usr/bin/mpiexec.mpich
  libmpich-dev:/usr/bin/mpicc.mpich
  iperf3:/usr/bin/iperf3
  python3:/usr/bin/python3
  iproute2:/usr/sbin/ip
  nftables:/usr/sbin/nft
  prometheus:/usr/bin/prometheus
  systemd:/usr/bin/systemd-analyze
  procps:/usr/bin/pgrep
  psmisc:/usr/bin/killall
  gdb:/usr/bin/gdb
  tshark:/usr/bin/tshark
  valgrind:/usr/bin/valgrind
)
missing=()
for p in "${pkgs[@]}"; do
  name=${p%%:*} file=${p#*:}
  [[ -e $file ]] || missing+=("$name")
done

if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    # tshark's wireshark-common asks whether non-root users may capture;
    # answer no beforehand so the install never stops at a prompt (the
    # tests only read traces, they never capture).
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing Debian packages: ${missing[*]}" >&2
    echo "deps: install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# CRIU 4.1 for the criu checkpoint backend, in its own prefix (see the
# script: the system's CRIU 3.17 does not run on this kernel).
"$(dirname "$0")/criu.sh"

command -v go >/dev/null || { echo "deps: Go is not on PATH (need Go >= 1.26)" >&2; exit 1; }
go mod download
