#!/usr/bin/env bash
# The simulator against vLLM itself: vLLM's CPU build serving SmolLM2 through its OpenAI server,
# n-gram speculation at k = 2, 4, 6 and none, closed loops at batch 1-16 on 512- and 2,048-token
# prompts and Poisson arrivals at two rates, predicted from a black-box calibration of that server
# with acceptance from each run's own counters and fitted on the others (docs/validation-servers.md).
#
#   scripts/validate-vllm-cpu.sh TEXT [OUT] [BUNDLE]
#
# TEXT: the plain text the prompts are cut from (../shared/data/pride_and_prejudice.txt);
# OUT: default validation/vllm-cpu; BUNDLE: an existing `calibrate --engine vllm` bundle (default:
# calibration/cpu-vllm/smollm2-135m, calibrated first if missing: about 15 minutes).
# Needs .vllm-venv and runs/smollm2-hf (scripts/setup-vllm-cpu.sh). The servers start afresh for
# every setting, its drafters back to back (--interleave) between a baseline before and one after
# (--bracket), so each speedup is over the mean of two baselines minutes from it; with the 60
# server starts (about 40 s each) this takes about 70 minutes on a 2-core CPU. Run nothing else on
# the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:?usage: scripts/validate-vllm-cpu.sh TEXT [OUT] [BUNDLE]}
out=${2:-validation/vllm-cpu}
bundle=${3:-calibration/cpu-vllm/smollm2-135m}
model=runs/smollm2-hf
if [ ! -f "$bundle/meta.json" ]; then
    python -m profiler calibrate --engine vllm --model "$model" --out "$bundle"
fi
common=(--engine vllm --model "$model" --method ngram --k 2 4 6 --baseline --interleave --bracket
        --text "$text" --max-new-tokens 64 --max-model-len 4096)
rm -rf "$out/c512" "$out/c2048" "$out/poisson"
python -m profiler serve-live "${common[@]}" --context 512 --batch 1 2 4 8 16 --limit 4 4 8 16 24 \
    --out "$out/c512" >/dev/null
python -m profiler serve-live "${common[@]}" --context 2048 --batch 1 2 4 8 16 --limit 4 4 8 16 24 \
    --out "$out/c2048" >/dev/null
python -m profiler serve-live "${common[@]}" --context 512 --rate 0.5 2 --limit 16 --out "$out/poisson" >/dev/null
# The docs' table is the committed study's: another OUT writes its validation.csv only.
docs=()
if [ "$out" = validation/vllm-cpu ]; then docs=(--docs docs/validation-servers.md); fi
python -m sim validate "$out"/c512/ "$out"/c2048/ "$out"/poisson/ --calibration "$bundle" --out "$out" \
    "${docs[@]}"
