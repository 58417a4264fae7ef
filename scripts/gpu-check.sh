#!/usr/bin/env bash
# The whole loop in one lent GPU slot: 8 minutes of wall time on one H100 or H200, of which the
# parts' limits and the setup take at most 7 (docs/validation-gpu.md budgets them), leaving one for
# the files' transfer. What the simulator's GPU validation needs runs first:
#   bandwidth  the device's copy rate (the weight-read time step times are set beside);
#   live       Llama-3.1-8B's shape, random weights, bf16, CUDA graphs, 512-token prompts, 64 new
#              tokens: autoregressive and the synthetic drafter (acceptance 0.8 and 0.6, k = 5 and
#              3, a one-layer head's draft cost) at the first CORE_BATCHES batches (1 and 64);
#   calibrate  a bundle of that shape that fits its slot (`calibrate --budget-s`);
#   live-rest  the same runs at the other batches (8 and 32);
#   specpv     SpecPV partial verification at 16K context beside its autoregressive run (the one
#              bf16 eager-kernel path not yet run on a GPU: last of the live parts);
#   kernels    the kernel and graph tests, compiled (the Triton kernels for real);
#   validate   step times over the weight-read time with the suspect runs flagged (something
#              compiled or captured while timed, a synthetic run over 2% off its record), and
#              `sim validate` by roofline and by bundle (all of it reproducible here afterwards).
# The live parts are one campaign file run a part at a time (`--only`), each part one process that
# loads the model once; each run folder is written whole or not at all, and a run that fails is
# recorded while the others run. Every part runs under its own `timeout -s INT` (Python stops as
# on Ctrl-C, pytest prints what failed), its exit status and seconds go to parts.tsv, and
# $OUT/gpu-check.tgz is rewritten after every part, so a slot cut short returns what finished.
# Results go to $OUT (default gpu-check-out/).
#
# On the GPU machine (torch and triton preinstalled, no network), carry gpu-wheels/, which
# scripts/fetch-gpu-wheels.sh fills on a machine with network (wheels this image lacks, SmolLM2's
# tokenizer), and run
#   timeout 440 env OUT=$OUT bash scripts/gpu-check.sh > $OUT/gpu-check.log 2>&1
# (the outer timeout only guards the setup: the parts end within their own limits).
# The CPU dry run (tests/test_gpu_check.py, in CI) runs the same parts at SmolLM2's shape:
#   DEVICE=cpu DTYPE=fp32 MODEL=smollm2-135m BATCHES="1 2" CORE_BATCHES=1 KS=3 ACCEPTANCES="0.8 0.6"
#   CONTEXT=128 NEW_TOKENS=12 SPECPV_CONTEXT=768 SPECPV_BUDGET=256 CAL_BUDGET_S=60
#   CAL_OPERATORS=(the operators a whole forward is composed of) PARTS="live calibrate live-rest specpv validate"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
MODEL=${MODEL:-llama-3.1-8b}
BATCHES=${BATCHES:-1 64 8 32}
CORE_BATCHES=${CORE_BATCHES:-2}
KS=${KS:-5 3}
ACCEPTANCES=${ACCEPTANCES:-0.8 0.6}
CONTEXT=${CONTEXT:-512}
NEW_TOKENS=${NEW_TOKENS:-64}
SPECPV_CONTEXT=${SPECPV_CONTEXT:-16384}
SPECPV_BUDGET=${SPECPV_BUDGET:-2048}
CAL_BUDGET_S=${CAL_BUDGET_S:-90}
CAL_OPERATORS=${CAL_OPERATORS:-}          # a comma-separated subset of the calibration's operators (default: all)
# The parts' limits (seconds): 365, plus 5 s each for a part that ignores SIGINT (KILL_AFTER) and
# about 20 s of setup, 420 (docs/validation-gpu.md).
LIVE_TIMEOUT=${LIVE_TIMEOUT:-95}
CAL_TIMEOUT=${CAL_TIMEOUT:-$((CAL_BUDGET_S + 25))}
REST_TIMEOUT=${REST_TIMEOUT:-50}
SPECPV_TIMEOUT=${SPECPV_TIMEOUT:-40}
KERNEL_TIMEOUT=${KERNEL_TIMEOUT:-40}
VALIDATE_TIMEOUT=${VALIDATE_TIMEOUT:-25}
KILL_AFTER=${KILL_AFTER:-5}
PARTS=${PARTS:-live calibrate live-rest specpv kernels validate}
TOKENIZER=${TOKENIZER:-gpu-wheels/smollm2-tokenizer.json}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# CUPTI's teardown at the end of each profiler session can hang a process that holds CUDA graphs
# (pytorch#112507); the launch counts open one profiler session per engine shape.
export TEARDOWN_CUPTI=0
[ "$DEVICE" = cuda ] && unset TRITON_INTERPRET
{
  date -u +"started %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import triton; print('triton', triton.__version__)" 2>/dev/null || echo "no triton"
  git rev-parse HEAD 2>/dev/null || echo "no git revision"
  echo "DEVICE=$DEVICE DTYPE=$DTYPE MODEL=$MODEL BATCHES='$BATCHES' KS='$KS' ACCEPTANCES='$ACCEPTANCES' CONTEXT=$CONTEXT"
  echo "CORE_BATCHES=$CORE_BATCHES NEW_TOKENS=$NEW_TOKENS SPECPV_CONTEXT=$SPECPV_CONTEXT SPECPV_BUDGET=$SPECPV_BUDGET"
  echo "CAL_BUDGET_S=$CAL_BUDGET_S PARTS='$PARTS'"
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

# part NAME TIMEOUT_S COMMAND...: run one part under its own timeout (SIGINT, then SIGKILL KILL_AFTER s
# later), its output in NAME.log; then the tarball again, with what every part so far wrote.
part() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most $limit s)"
  local started=$SECONDS
  timeout -s INT --kill-after="$KILL_AFTER" "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  if [ $status -eq 124 ] || [ $status -eq 137 ]; then echo "   $name stopped at its timeout"; fi
  printf "%s\t%s\t%s\n" "$name" "$status" "$((SECONDS - started))" >> "$OUT/parts.tsv"
  tail -6 "$OUT/$name.log"
  pack
}

skip() {
  echo "== $1: $2"
  printf "%s\tskipped\t0\n" "$1" >> "$OUT/parts.tsv"
}

pack() {
  tar czf /tmp/gpu-check.tgz -C "$OUT" --exclude=gpu-check.tgz --exclude=prompts-text.md . \
    && mv /tmp/gpu-check.tgz "$OUT/gpu-check.tgz"
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

# Every live run in one campaign file, each part running its own (`--only`): the batches of the first
# CORE_BATCHES first, the rest after, SpecPV last.
batch_runs() {
  local batch=$1
  echo "  - {name: none-b$batch, method: none, context: $CONTEXT, batch: $batch, limit: $batch}"
  for acceptance in $ACCEPTANCES; do
    for k in $KS; do
      echo "  - {name: synthetic-k$k-a$acceptance-b$batch, method: synthetic, acceptance: [$acceptance]," \
           "draft_shape: head, k: $k, context: $CONTEXT, batch: $batch, limit: $batch}"
    done
  done
}

write_campaign() {
  local first_k=${KS%% *} first_acceptance=${ACCEPTANCES%% *}
  echo "name: gpu-check"
  echo "defaults: {model: $MODEL, device: $DEVICE, dtype: $DTYPE, max_new_tokens: $NEW_TOKENS, seed: 0}"
  echo "runs:"
  for batch in $BATCHES; do
    batch_runs "$batch"
  done
  echo "  - {name: none-c$SPECPV_CONTEXT-b1, method: none, context: $SPECPV_CONTEXT, batch: 1, limit: 1}"
  echo "  - {name: specpv-k$first_k-a$first_acceptance-b1, method: synthetic, acceptance: [$first_acceptance]," \
       "draft_shape: head, k: $first_k, context: $SPECPV_CONTEXT, batch: 1, limit: 1, budget: $SPECPV_BUDGET," \
       "period: 20}"
}

# The run names of one live part: core (the first CORE_BATCHES batches), rest, or specpv.
part_runs() {
  if [ "$1" = specpv ]; then
    grep -o "name: [^,]*c$SPECPV_CONTEXT[^,]*\|name: specpv[^,]*" "$OUT/campaign.yaml" | cut -d' ' -f2
    return
  fi
  local i=0
  for batch in $BATCHES; do
    i=$((i + 1))
    if { [ "$1" = core ] && [ $i -le "$CORE_BATCHES" ]; } || { [ "$1" = rest ] && [ $i -gt "$CORE_BATCHES" ]; }; then
      batch_runs "$batch" | grep -o "name: [^,]*" | cut -d' ' -f2
    fi
  done
}

live_part() {
  local name=$1 runs limit=$3
  if [ ! -f "$OUT/campaign.yaml" ]; then
    write_campaign > "$OUT/campaign.yaml"
    # The tokenizer of random weights where SmolLM2's package is not installed (the GPU image).
    [ -f "$TOKENIZER" ] && sed -i "s|^defaults: {|defaults: {tokenizer: $TOKENIZER, |" "$OUT/campaign.yaml"
  fi
  [ -f "$OUT/prompts-text.md" ] || cat docs/*.md > "$OUT/prompts-text.md"     # random weights: any text times the same
  runs=$(part_runs "$2")
  if [ -z "$runs" ]; then
    skip "$name" "no runs"
    return
  fi
  # shellcheck disable=SC2086
  part "$name" "$limit" python3 -m profiler campaign "$OUT/campaign.yaml" --text "$OUT/prompts-text.md" --out "$LIVE" \
    --only $runs
}

part_live() { live_part live core "$LIVE_TIMEOUT"; }
part_live-rest() { live_part live-rest rest "$REST_TIMEOUT"; }
part_specpv() { live_part specpv specpv "$SPECPV_TIMEOUT"; }

part_calibrate() {
  local operators=()
  [ -n "$CAL_OPERATORS" ] && operators=(--operators "$CAL_OPERATORS")
  part calibrate "$CAL_TIMEOUT" python3 -m profiler calibrate --device "$DEVICE" --model "$MODEL" --dtype "$DTYPE" \
    --budget-s "$CAL_BUDGET_S" "${operators[@]}" --out "$BUNDLE"
}

part_validate() {
  # The finished runs (a campaign stopped at its timeout keeps those): sim validate reads them.
  local runs=("$LIVE"/*/meta.json)
  if [ ! -f "${runs[0]}" ]; then
    skip validate "no live runs"
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
  # What a GPU alone can show first: real graphs replayed against the eager path's tokens, the
  # engine's kernel path; then the kernels' own tests (what the timeout cuts first).
  part kernels "$KERNEL_TIMEOUT" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider tests/profiler/test_graphs.py \
    tests/profiler/test_engine_kernels.py tests/spec_kernels/
}

measure_bandwidth
pack
for name in $PARTS; do
  "part_$name"
done
date -u +"ended %Y-%m-%dT%H:%M:%SZ" >> "$OUT/environment.txt"
cat "$OUT/parts.tsv"
pack
echo "wrote $OUT/gpu-check.tgz"
