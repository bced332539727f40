#!/bin/sh
# System packages the tests and benchmarks need, installed with apt-get when we are root on
# Debian/Ubuntu:
#   nginx (nginx-light where the release has it): an HTTP server that answers Range requests;
#   openssl: makes the TLS test certificate;
#   fuse3 + libfuse2: FUSE for the storage emulator (scripts/storage_emulator.py) and its test;
#   chromium: the headless browser that loads the --html report pages and the docs site in their tests.
# Without them their tests skip locally; under CI (CI=true, as .ci/run sets it) a skip is a
# failure, so a CI machine that cannot install them stops here with the list.
# `system_deps.sh demo` (make demo): fuse3 + libfuse2 only, and a missing one is a note, never a
# failure (the demo then says in one line why it skips the emulated network storage).
SET=${1:-all}
case "$SET" in all|demo) ;; *) echo "usage: system_deps.sh [all|demo]" >&2; exit 2;; esac
missing() {
  m=""
  if [ "$SET" = demo ]; then
    command -v fusermount3 >/dev/null 2>&1 || m="$m fuse3"
    ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2' || m="$m libfuse2"
    echo "$m"; return
  fi
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || m="$m nginx"
  command -v openssl >/dev/null 2>&1 || m="$m openssl"
  command -v fusermount3 >/dev/null 2>&1 || m="$m fuse3"
  ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2' || m="$m libfuse2"
  command -v chromium >/dev/null 2>&1 || m="$m chromium"
  echo "$m"
}
todo=$(missing)
if [ -n "$todo" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing$todo (apt-get)"
  pkgs=""
  for m in $todo; do
    if [ "$m" = nginx ]; then
      apt-get update -qq
      if apt-cache show nginx-light >/dev/null 2>&1; then pkgs="$pkgs nginx-light"; else pkgs="$pkgs nginx"; fi
    else
      pkgs="$pkgs $m"
    fi
  done
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  todo=$(missing)
fi
if [ -n "$todo" ] && [ "$SET" = demo ]; then
  echo "note: not installed:$todo (Debian: apt-get install fuse3 libfuse2); the demo skips emulated network storage"
  exit 0
fi
if [ -n "$todo" ]; then
  echo "note: not installed:$todo (Debian: apt-get install nginx-light openssl fuse3 libfuse2 chromium); their tests skip"
  case "${CI:-}" in ""|0|false|no|off) ;; *) echo "CI=$CI: required parts missing:$todo" >&2; exit 1;; esac
fi
exit 0
