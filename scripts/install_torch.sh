#!/bin/sh
# Install torch into the given interpreter's environment without pulling a CUDA build onto a
# machine that has no GPU. Order: keep a working torch; TORCH_SPEC if set; on a GPU machine the
# default build; otherwise a CPU build: a local "+cpu" wheel that pip's find-links offers, then
# the PyTorch CPU index (TORCH_CPU_INDEX).
set -e
PY=${1:-python3}
if "$PY" -c "import torch" 2>/dev/null; then
  echo "torch $("$PY" -c 'import torch; print(torch.__version__)') already installed"; exit 0
fi
if [ -n "$TORCH_SPEC" ]; then
  exec "$PY" -m pip install -q "$TORCH_SPEC"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  exec "$PY" -m pip install -q "torch>=2.1"
fi
for v in 2.13.0 2.14.1; do
  if "$PY" -m pip install -q --only-binary=:all: "torch==$v+cpu" 2>/dev/null; then exit 0; fi
done
exec "$PY" -m pip install -q torch --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
