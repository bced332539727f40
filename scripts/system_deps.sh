#!/bin/sh
# System packages the tests and benchmarks need, installed with apt-get when we are root on
# Debian/Ubuntu:
#   nginx (nginx-light where the release has it): an HTTP server that answers Range requests;
#   openssl: makes the TLS test certificate;
#   fuse3 + libfuse2: FUSE for the storage emulator (scripts/storage_emulator.py) and its test;
#   chromium: the headless browser that loads the --html report pages in their tests.
# Without them their tests skip locally; under CI (CI=true, as .ci/run sets it) a skip is a
# failure, so a CI machine that cannot install them stops here with the list.
missing() {
  m=""
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
if [ -n "$todo" ]; then
  echo "note: not installed:$todo (Debian: apt-get install nginx-light openssl fuse3 libfuse2 chromium); their tests skip"
  case "${CI:-}" in ""|0|false|no|off) ;; *) echo "CI=$CI: required parts missing:$todo" >&2; exit 1;; esac
fi
exit 0
