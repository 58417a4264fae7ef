#!/usr/bin/env bash
# Fill gpu-wheels/ (ignored by git; name it in the device tool's `carry`) with what
# scripts/gpu-check.sh needs on a GPU image that lacks them and has no network: the wheels of
# simpy, gguf, pydantic and plotly (for Python 3.12, x86-64), and SmolLM2's tokenizer as tokenizer.json.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p gpu-wheels
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 -d gpu-wheels simpy gguf pydantic pydantic-core annotated-types typing-inspection \
  typing-extensions plotly
python3 -c "
import gguf
from profiler.engine.gguf_loader import smollm2_path
from profiler.engine.tokenizer import tokenizer_from_gguf
tok = tokenizer_from_gguf(gguf.GGUFReader(smollm2_path()))
tok.save('gpu-wheels/smollm2-tokenizer.json')
"
ls -la gpu-wheels
