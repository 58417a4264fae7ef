#!/usr/bin/env bash
# The whole loop in one lent GPU slot (at most 8 minutes of wall time on one H100 or H200):
#   live       Llama-3.1-8B's shape, random weights, bf16, CUDA graphs: autoregressive and the
#              synthetic drafter (known acceptance 0.6 and 0.8, k = 3 and 5, a one-layer head's
#              draft cost) at batch 1, 64, 8 and 32, 512-token prompts, 64 new tokens; then one
#              SpecPV partial-verification run at 16K context beside its autoregressive run;
#   calibrate  a bundle of that shape that fits its slot (`calibrate --budget-s`);
#   validate   `sim validate` of the live runs against the bundle and against the roofline, and
#              the step times beside the weight-read time (scripts/step_times.py);
#   kernels    the kernel tests, compiled (the Triton kernels for real).
# Each part runs under its own timeout, so a part that hangs or is killed leaves the others' files;
# every part's exit status and seconds go to parts.tsv, and everything to one tarball at the end
# ($OUT/gpu-check.tgz). Results go to $OUT (default gpu-check-out/).
#
# On the GPU machine (torch and triton preinstalled, no network), carry gpu-wheels/, which
# scripts/fetch-gpu-wheels.sh fills on a machine with network (wheels this image lacks, SmolLM2's
# tokenizer), and run
#   timeout 500 env OUT=$OUT bash scripts/gpu-check.sh > $OUT/gpu-check.log 2>&1
# The CPU dry run (tests/test_gpu_check.py, in CI) runs the same parts at SmolLM2's shape:
#   DEVICE=cpu DTYPE=fp32 MODEL=smollm2-135m BATCHES="1 2" KS=3 ACCEPTANCES=0.8 CONTEXT=128 NEW_TOKENS=16
#   SPECPV_CONTEXT=1024 SPECPV_BUDGET=256 CAL_BUDGET_S=45 PARTS="live calibrate validate"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
MODEL=${MODEL:-llama-3.1-8b}
BATCHES=${BATCHES:-1 64 8 32}
KS=${KS:-5 3}
ACCEPTANCES=${ACCEPTANCES:-0.8 0.6}
CONTEXT=${CONTEXT:-512}
NEW_TOKENS=${NEW_TOKENS:-64}
SPECPV_CONTEXT=${SPECPV_CONTEXT:-16384}
SPECPV_BUDGET=${SPECPV_BUDGET:-2048}
CAL_BUDGET_S=${CAL_BUDGET_S:-160}
LIVE_TIMEOUT=${LIVE_TIMEOUT:-170}
CAL_TIMEOUT=${CAL_TIMEOUT:-$((CAL_BUDGET_S + 40))}
VALIDATE_TIMEOUT=${VALIDATE_TIMEOUT:-60}
KERNEL_TIMEOUT=${KERNEL_TIMEOUT:-75}
PARTS=${PARTS:-live calibrate validate kernels}
TOKENIZER=${TOKENIZER:-gpu-wheels/smollm2-tokenizer.json}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ "$DEVICE" = cuda ] && unset TRITON_INTERPRET
{
  date -u +"started %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import triton; print('triton', triton.__version__)" 2>/dev/null || echo "no triton"
  git rev-parse HEAD 2>/dev/null || echo "no git revision"
  echo "DEVICE=$DEVICE DTYPE=$DTYPE MODEL=$MODEL BATCHES='$BATCHES' KS='$KS' ACCEPTANCES='$ACCEPTANCES' CONTEXT=$CONTEXT"
  echo "NEW_TOKENS=$NEW_TOKENS SPECPV_CONTEXT=$SPECPV_CONTEXT SPECPV_BUDGET=$SPECPV_BUDGET CAL_BUDGET_S=$CAL_BUDGET_S PARTS='$PARTS'"
} 2>&1 | tee "$OUT/environment.txt"
if compgen -G "gpu-wheels/*.whl" >/dev/null; then
  # Beside the image's packages, not over them: a read-only or shared image stays as it was.
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
    gpu-wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH="/tmp/gpu-site:$PYTHONPATH"
fi
LIVE="$OUT/live"
BUNDLE="$OUT/calibration/$MODEL"
printf "part\texit\tseconds\n" > "$OUT/parts.tsv"

# part NAME TIMEOUT_S COMMAND...: run one part under its own timeout, its output in NAME.log.
part() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most $limit s)"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  if [ $status -eq 124 ] || [ $status -eq 137 ]; then echo "   $name stopped at its timeout"; fi
  printf "%s\t%s\t%s\n" "$name" "$status" "$((SECONDS - started))" >> "$OUT/parts.tsv"
  tail -6 "$OUT/$name.log"
}

# The device's streaming bandwidth (bytes read + written by a large copy, GB/s): the weight-read
# time the step times are set beside.
measure_bandwidth() {
  python3 - "$DEVICE" > "$OUT/bandwidth.txt" 2>/dev/null <<'PY' || echo 0 > "$OUT/bandwidth.txt"
import sys, time, torch
device = sys.argv[1]
size = (1 << 31) if device == "cuda" else (1 << 28)
src = torch.empty(size, dtype=torch.uint8, device=device)
dst = torch.empty_like(src)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
for _ in range(3):
    dst.copy_(src)
sync()
started = time.perf_counter()
for _ in range(10):
    dst.copy_(src)
sync()
print(round(2 * size * 10 / (time.perf_counter() - started) / 1e9, 1))
PY
  echo "copy bandwidth: $(cat "$OUT/bandwidth.txt") GB/s (read + write)" | tee -a "$OUT/environment.txt"
}

# The live runs as one campaign (one process, the model loaded once; each run folder is written
# whole or not at all, so a campaign stopped at its timeout keeps the runs it finished), the
# settings that matter most first: batch 1 and the largest batch, then SpecPV, then the rest.
write_campaign() {
  local first_k=${KS%% *} first_acceptance=${ACCEPTANCES%% *} i=0
  echo "name: gpu-check"
  echo "defaults: {model: $MODEL, device: $DEVICE, dtype: $DTYPE, max_new_tokens: $NEW_TOKENS, seed: 0}"
  echo "runs:"
  for batch in $BATCHES; do
    echo "  - {name: none-b$batch, method: none, context: $CONTEXT, batch: $batch, limit: $batch}"
    for acceptance in $ACCEPTANCES; do
      for k in $KS; do
        echo "  - {name: synthetic-k$k-a$acceptance-b$batch, method: synthetic, acceptance: [$acceptance]," \
             "draft_shape: head, k: $k, context: $CONTEXT, batch: $batch, limit: $batch}"
      done
    done
    i=$((i + 1))
    if [ $i -eq 2 ] || [ "$(echo $BATCHES | wc -w)" -eq 1 ]; then
      echo "  - {name: none-c$SPECPV_CONTEXT-b1, method: none, context: $SPECPV_CONTEXT, batch: 1, limit: 1}"
      echo "  - {name: specpv-k$first_k-a$first_acceptance-b1, method: synthetic, acceptance: [$first_acceptance]," \
           "draft_shape: head, k: $first_k, context: $SPECPV_CONTEXT, batch: 1, limit: 1, budget: $SPECPV_BUDGET," \
           "period: 20}"
    fi
  done
}

part_live() {
  write_campaign > "$OUT/campaign.yaml"
  # The tokenizer of random weights where SmolLM2's package is not installed (the GPU image).
  [ -f "$TOKENIZER" ] && sed -i "s|^defaults: {|defaults: {tokenizer: $TOKENIZER, |" "$OUT/campaign.yaml"
  cat docs/*.md > "$OUT/prompts-text.md"        # random weights: any text times the same
  part live "$LIVE_TIMEOUT" python3 -m profiler campaign "$OUT/campaign.yaml" --text "$OUT/prompts-text.md" --out "$LIVE"
}

part_calibrate() {
  part calibrate "$CAL_TIMEOUT" python3 -m profiler calibrate --device "$DEVICE" --model "$MODEL" --dtype "$DTYPE" \
    --budget-s "$CAL_BUDGET_S" --out "$BUNDLE"
}

part_validate() {
  # The finished runs (a campaign stopped at its timeout keeps those): sim validate reads them.
  local runs=("$LIVE"/*/meta.json)
  if [ ! -f "${runs[0]}" ]; then
    echo "== validate: no live runs"
    printf "validate\tskipped\t0\n" >> "$OUT/parts.tsv"
    return
  fi
  local calibrated=()
  [ -f "$BUNDLE/meta.json" ] && calibrated=(--calibration "$BUNDLE")
  runs=("${runs[@]%/meta.json}")
  part validate "$VALIDATE_TIMEOUT" bash -c "
    python3 scripts/step_times.py ${runs[*]} --read-gb-s $(cat "$OUT/bandwidth.txt") > '$OUT/step-times.txt'
    cat '$OUT/step-times.txt'
    echo '-- roofline'; python3 -m sim validate ${runs[*]} --out '$OUT/validate-roofline' || exit 1
    if [ ${#calibrated[@]} -gt 0 ]; then
      echo '-- calibrated'; python3 -m sim validate ${runs[*]} ${calibrated[*]} --out '$OUT/validate-calibrated'
    fi"
}

part_kernels() {
  # The graphs first: on CUDA they replay real graphs against the eager path's tokens.
  part kernels "$KERNEL_TIMEOUT" python3 -m pytest -q -p no:cacheprovider tests/profiler/test_graphs.py \
    tests/profiler/test_engine_kernels.py tests/spec_kernels/test_kernels_attention.py tests/spec_kernels/test_kernels_selection_quant.py
}

measure_bandwidth
for name in $PARTS; do
  "part_$name"
done
date -u +"ended %Y-%m-%dT%H:%M:%SZ" >> "$OUT/environment.txt"
cat "$OUT/parts.tsv"
tar czf /tmp/gpu-check.tgz -C "$OUT" --exclude=gpu-check.tgz --exclude=prompts-text.md . && mv /tmp/gpu-check.tgz "$OUT/gpu-check.tgz"
echo "wrote $OUT/gpu-check.tgz"
