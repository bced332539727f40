#!/bin/sh
# The peer loaders of scripts/bench_peers.py in a virtual environment of their own (they need a
# torch with a matching torchvision, and FFCV's numba, neither of which fits .venv's pins).
#   sh scripts/install_peers.sh VENV [TORCH_SPECS]
# TORCH_SPECS (default "torch==2.14.1 torchvision==0.29.1") is installed first; then each peer is
# installed on its own, with the same torch pinned, so one that fails is reported and the others
# still install. FFCV builds from source: it needs pkg-config and the OpenCV and libjpeg-turbo
# headers, installed with apt-get when we are root on Debian. The last lines printed say which
# peers did not install; VENV/peers-install.txt keeps them (bench_peers.py reports those peers as
# not importable). VENV/.installed is written only when every peer installed. Exits 0 even when
# some peers fail: the benchmark's table says which.
set -u
venv=${1:?usage: install_peers.sh VENV [TORCH_SPECS]}
torch_specs=${2:-"torch==2.14.1 torchvision==0.29.1"}
py="$venv/bin/python"
report="$venv/peers-install.txt"

if [ ! -x "$py" ]; then
  python3 -m venv "$venv" || { echo "peers: could not create $venv" >&2; exit 1; }
fi
: >"$report"
failed=""

note() {  # peer, reason
  echo "$1: $2" >>"$report"
  failed="$failed $1"
  echo "peers: $1 did not install ($2)"
}

"$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# shellcheck disable=SC2086
if ! "$py" -m pip install -q $torch_specs; then
  note torch "pip install $torch_specs failed"
fi
# pin the installed torch for every peer, so that no peer's requirements replace it
pins=""
for spec in $torch_specs; do
  name=${spec%%[=<>!~]*}
  ver=$("$py" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null) && pins="$pins $name==$ver"
done

if ! pkg-config --exists opencv4 2>/dev/null || ! pkg-config --exists libturbojpeg 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "peers: installing pkg-config libopencv-dev libturbojpeg0-dev (apt-get) for FFCV"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        pkg-config libopencv-dev libturbojpeg0-dev; } >/dev/null 2>&1 || echo "peers: apt-get install failed"
  else
    echo "peers: FFCV needs pkg-config libopencv-dev libturbojpeg0-dev (not root or no apt-get)"
  fi
fi

# peer name, then its pip requirements
for line in "webdataset webdataset" "litdata litdata" "mosaicml-streaming mosaicml-streaming" \
            "ffcv ffcv numba pillow"; do
  peer=${line%% *}
  reqs=${line#* }
  echo "peers: installing $peer"
  # shellcheck disable=SC2086
  if ! out=$("$py" -m pip install -q $pins $reqs 2>&1); then
    note "$peer" "$(printf '%s\n' "$out" | grep -v '^ *$' | tail -n 1 | cut -c1-200)"
  fi
done

if [ -n "$failed" ]; then
  echo "peers: not installed in $venv:$failed (see $report)"
else
  echo "peers: all installed in $venv"
  touch "$venv/.installed"
fi
exit 0
