#!/usr/bin/env bash
# One prepared run on a GPU machine: the kernel tests for real (bf16 included), the live engine's
# kernel path against its torch path, kernel timings, and a short live AR / ngram / shadow
# comparison in bf16, and a quick calibration bundle. Results go to $OUT (default gpu-check-out/).
#
# Made for a machine with torch and triton preinstalled and no network (this workplace's H200
# image): packages it lacks travel as wheels in gpu-wheels/, which scripts/fetch-gpu-wheels.sh
# fills on a machine with network. SmolLM2's GGUF (93 MB) is over what travels, so the live
# comparison runs random weights of SmolLM2's shape (timing only) with its tokenizer, exported
# into gpu-wheels/ too. Budget: about 11 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/environment.txt"
if compgen -G "gpu-wheels/*.whl" >/dev/null; then
  python3 -m pip install --quiet --no-index --no-deps gpu-wheels/*.whl 2>&1 | tail -3
fi

echo "== kernel tests (CUDA, real Triton)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
  tests/test_kernels_selection_quant.py tests/test_engine_kernels.py 2>&1 | tee "$OUT/kernel-tests.log" | tail -15

echo "== kernel timings"
timeout 150 python3 benchmarks/bench_kernels.py --out "$OUT/kernels.json" > /dev/null 2> "$OUT/kernels.err" \
  && echo "wrote $OUT/kernels.json" || tail -5 "$OUT/kernels.err"

echo "== live: none / ngram / shadow int4, bf16, random weights of SmolLM2's shape"
TOKENIZER=gpu-wheels/smollm2-tokenizer.json
for method in none ngram shadow; do
  rm -rf "/tmp/gpu-live-$method"
  timeout 60 python3 -m profiler live --model smollm2-135m --tokenizer "$TOKENIZER" --device cuda --dtype bf16 \
    --method "$method" --k 4 --batch 8 --limit 8 --max-new-tokens 64 --out "/tmp/gpu-live-$method" \
    > /dev/null 2> "$OUT/live-$method.err" && cp "/tmp/gpu-live-$method/summary.json" "$OUT/live-$method.json" \
    && echo "wrote $OUT/live-$method.json" || tail -3 "$OUT/live-$method.err"
done

echo "== calibration bundle (quick grid; the full one takes up to 10 minutes on an H200)"
timeout 200 python3 -m profiler calibrate --device cuda --quick --out "$OUT/calibration/smollm2-135m" \
  > "$OUT/calibrate.log" 2>&1 && tail -4 "$OUT/calibrate.log" || tail -5 "$OUT/calibrate.log"
