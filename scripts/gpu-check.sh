#!/usr/bin/env bash
# One prepared run on a GPU machine: the kernel tests for real (bf16 included), the live engine's
# kernel path against its torch path, kernel timings; then Llama-3.1-8B's shape with random weights
# in bf16 (issue 24): live autoregressive and n-gram runs at batch 1, 8 and 64, a quick calibration
# of that shape, and `sim validate` of the live runs against the roofline and against the bundle.
# PARTS picks the parts and their order (default: big; "kernels" was measured on 2026-12-04, see
# validation/gpu-h200/); "small" adds the SmolLM2-shape live runs and bundle.
# Results go to $OUT (default gpu-check-out/).
#
# Made for a machine with torch and triton preinstalled and no network (this workplace's H200
# image): packages it lacks travel as wheels in gpu-wheels/, which scripts/fetch-gpu-wheels.sh
# fills on a machine with network. SmolLM2's GGUF (93 MB) is over what travels, so the live
# comparison runs random weights of SmolLM2's shape (timing only) with its tokenizer, exported
# into gpu-wheels/ too. Budget on an H200: the six live runs about 2.5 minutes, the quick
# calibration about 5 (2.5 points a second), the kernel part about 3. The device tool returns at
# most 8 files, so run it as
#   timeout 540 env OUT=/tmp/gc bash scripts/gpu-check.sh > /tmp/gc.log 2>&1; tar czf $OUT/gc.tgz -C /tmp gc gc.log
# with gpu-wheels carried. Tested on a CPU with
#   DEVICE=cpu DTYPE=fp32 BIG_MODEL=smollm2-135m BIG_BATCHES="1 4" TOKENIZER=<smollm2 tokenizer.json> PARTS=big
# (the same commands at a shape that fits a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
PARTS=${PARTS:-big}
CAL_TIMEOUT=${CAL_TIMEOUT:-330}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
BIG_MODEL=${BIG_MODEL:-llama-3.1-8b}
BIG_BATCHES=${BIG_BATCHES:-1 8 64}
TOKENIZER=${TOKENIZER:-gpu-wheels/smollm2-tokenizer.json}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null || echo "no git revision"
} 2>&1 | tee "$OUT/environment.txt"
if compgen -G "gpu-wheels/*.whl" >/dev/null; then
  # Beside the image's packages, not over them: a read-only or shared image stays as it was.
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
    gpu-wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH="/tmp/gpu-site:$PYTHONPATH"
fi

part_kernels() {
echo "== kernel tests (CUDA, real Triton)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
  tests/test_kernels_selection_quant.py tests/test_engine_kernels.py 2>&1 | tee "$OUT/kernel-tests.log" | tail -15

echo "== kernel timings"
timeout 100 python3 benchmarks/bench_kernels.py --out "$OUT/kernels.json" > /dev/null 2> "$OUT/kernels.err" \
  && echo "wrote $OUT/kernels.json" || tail -5 "$OUT/kernels.err"
}

part_big() {
echo "== $BIG_MODEL shape, random weights, $DTYPE: live none / ngram at batch $BIG_BATCHES"
# Prompts of 512 tokens cut from a text in the repository (random weights: any text times the same):
# the docs together, since batch 64 needs some 30,000 tokens.
LIVE="$OUT/live-$BIG_MODEL"
mkdir -p "$LIVE"
TEXT="$OUT/prompts-text.md"
cat docs/*.md > "$TEXT"
for batch in $BIG_BATCHES; do
  for method in none ngram; do
    run="$LIVE/$method-b$batch"
    rm -rf "$run"
    timeout 90 python3 -m profiler live --model "$BIG_MODEL" --tokenizer "$TOKENIZER" --device "$DEVICE" \
      --dtype "$DTYPE" --method "$method" --k 4 --batch "$batch" --limit "$batch" --context 512 \
      --text "$TEXT" --max-new-tokens 64 --out "$run" > /dev/null 2> "$run.err" \
      && echo "wrote $run" || tail -3 "$run.err"
  done
done
echo "== quick calibration of the $BIG_MODEL shape"
BUNDLE="$OUT/calibration/$BIG_MODEL"
timeout "$CAL_TIMEOUT" python3 -m profiler calibrate --device "$DEVICE" --model "$BIG_MODEL" --dtype "$DTYPE" --quick \
  --out "$BUNDLE" > "$OUT/calibrate-$BIG_MODEL.log" 2>&1 && tail -4 "$OUT/calibrate-$BIG_MODEL.log" \
  || tail -5 "$OUT/calibrate-$BIG_MODEL.log"
echo "== the same points predicted: roofline, then calibrated"
timeout 60 python3 -m sim validate "$LIVE"/*/ --out "$OUT/validate-roofline" 2>&1 | tail -8
[ -d "$BUNDLE" ] && timeout 60 python3 -m sim validate "$LIVE"/*/ --calibration "$BUNDLE" \
  --out "$OUT/validate-calibrated" 2>&1 | tail -8
}

part_small() {
echo "== live: none / ngram / shadow int4, bf16, random weights of SmolLM2's shape"
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
}

for part in $PARTS; do
  "part_$part"
done
