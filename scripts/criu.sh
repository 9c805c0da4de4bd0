#!/usr/bin/env bash
# Installs CRIU 4.1 into a private prefix (default /opt/radic/criu) for the
# checkpoint package's criu backend.
#
# Why not `apt-get install criu`: Debian 12's CRIU 3.17 cannot detect this
# kernel's features (`criu check`: "vdso: Unexpected rt vDSO area bounds").
# Debian 13's 4.1 works but needs glibc 2.38, so its package and the
# libraries it depends on (computed by apt, recursively) are unpacked with
# `dpkg -x` into the prefix and run with their own loader through the
# wrapper PREFIX/bin/criu. Nothing is installed system-wide: apt runs with a
# private sources list, lists and cache under a temporary directory, so the
# system's apt sources and state are left exactly as they were
# (../shared/notes/checkpoint.md).
#
# Idempotent: a prefix whose wrapper already answers `--version` with the
# wanted version is left alone. Exits non-zero only when it was asked to
# install and could not; not root or no apt: says so and exits 0, since the
# criu backend then reports itself unusable and radic falls back to exec.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
prefix=${RADIC_CRIU_PREFIX:-/opt/radic/criu}
# Bump when what goes into the prefix changes, so that an older prefix is
# made again.
layout=2
want=${RADIC_CRIU_VERSION:-4.1}
suite=trixie
mirror=http://deb.debian.org/debian

installed() {
  [[ -x $prefix/bin/criu && $(cat "$prefix/LAYOUT" 2>/dev/null) == "$layout" ]] &&
    "$prefix/bin/criu" --version 2>/dev/null | grep -q "^Version: $want"
}
if installed; then
  exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "criu: not installing CRIU $want into $prefix (needs root, apt-get and dpkg); the criu checkpoint backend will be unusable" >&2
  exit 0
fi
arch=$(dpkg --print-architecture)
case $arch in
  amd64) triplet=x86_64-linux-gnu loader=ld-linux-x86-64.so.2 ;;
  arm64) triplet=aarch64-linux-gnu loader=ld-linux-aarch64.so.1 ;;
  *) echo "criu: architecture $arch is not supported here" >&2; exit 1 ;;
esac

tmp=$(mktemp -d /tmp/radic-criu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# apt's sandbox user must be able to read the private directories.
chmod 755 "$tmp"
mkdir -p "$tmp/etc" "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs" "$tmp/root"
cat >"$tmp/etc/$suite.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
if [[ ! -s /usr/share/keyrings/debian-archive-keyring.gpg ]]; then
  echo "criu: /usr/share/keyrings/debian-archive-keyring.gpg is missing (package debian-archive-keyring)" >&2
  exit 1
fi
apt_opts=(
  -o "Dir::Etc::SourceList=/dev/null"
  -o "Dir::Etc::SourceParts=$tmp/etc"
  -o "Dir::Etc::Preferences=/dev/null"
  -o "Dir::Etc::PreferencesParts=$tmp/etc"
  -o "Dir::State::Lists=$tmp/lists"
  -o "Dir::State::status=/dev/null"
  -o "Dir::Cache=$tmp/cache"
  -o "Debug::NoLocking=1"
  -o "APT::Architectures=$arch"
  -o "APT::Sandbox::User=root"
)
echo "criu: fetching CRIU $want and its libraries from Debian $suite into $prefix" >&2
apt-get "${apt_opts[@]}" -q update >/dev/null
ver=$(apt-cache "${apt_opts[@]}" show criu | sed -n 's/^Version: //p' | head -1)
[[ $ver == "$want"* ]] || { echo "criu: Debian $suite has criu $ver, want $want" >&2; exit 1; }
# Every package criu needs at run time, recursively (libc6 included: the
# point is to run it with trixie's loader and glibc).
mapfile -t debs < <(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances criu | grep -v '^ ' | grep -v '^<' | sort -u)
(cd "$tmp/debs" && apt-get "${apt_opts[@]}" -q download "${debs[@]}" >/dev/null)
for f in "$tmp"/debs/*.deb; do
  dpkg -x "$f" "$tmp/root"
done
mkdir -p "$tmp/root/bin" "$tmp/root/lib/radic"
# Linux 6.16+ refuses SO_PASS* options on TCP sockets and CRIU 4.1 stops
# there; scripts/criu/compat.c answers them as upstream's fix does.
cc=${CC:-gcc}
command -v "$cc" >/dev/null || { echo "criu: $cc is needed to build $here/criu/compat.c" >&2; exit 1; }
"$cc" -shared -fPIC -O2 -Wall -Werror -o "$tmp/root/lib/radic/compat.so" "$here/criu/compat.c"
cat >"$tmp/root/bin/criu" <<WRAP
#!/bin/sh
# CRIU $ver from Debian $suite, run with its own loader and libraries
# (installed by radic's scripts/criu.sh; nothing of it is system-wide).
p=$prefix
exec "\$p/usr/lib/$triplet/$loader" --library-path "\$p/usr/lib/$triplet:\$p/lib/$triplet" \\
  --preload "\$p/lib/radic/compat.so" "\$p/usr/sbin/criu" "\$@"
WRAP
chmod 755 "$tmp/root/bin/criu"
printf '%s\n' "${debs[@]}" >"$tmp/root/PACKAGES"
echo "$layout" >"$tmp/root/LAYOUT"
# Swap the new tree in whole, so a half-made prefix is never used.
mkdir -p "$(dirname "$prefix")"
rm -rf "$prefix.new" "$prefix.old"
mv "$tmp/root" "$prefix.new"
[[ -e $prefix ]] && mv "$prefix" "$prefix.old"
mv "$prefix.new" "$prefix"
rm -rf "$prefix.old"
if ! installed; then
  echo "criu: $prefix/bin/criu does not run:" >&2
  "$prefix/bin/criu" --version >&2 || true
  exit 1
fi
echo "criu: $("$prefix/bin/criu" --version | head -1) in $prefix (${#debs[@]} packages)" >&2
