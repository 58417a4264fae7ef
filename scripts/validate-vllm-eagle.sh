#!/usr/bin/env bash
# The simulator against vLLM's EAGLE: vLLM's CPU build serving SmolLM2 with the committed EAGLE-1
# head (heads/smollm2-135m-eagle1, exported as vLLM's checkpoint folder) at k = 4 and without
# speculation, closed loops at batch 1-16 on 512- and 2,048-token prompts and Poisson
# arrivals at two rates, predicted from a black-box calibration of that server that also times the
# head's drafting (`calibrate --engine vllm --head`), with acceptance from each run's own counters
# and fitted on the others (docs/validation-servers.md).
#
#   scripts/validate-vllm-eagle.sh TEXT [OUT] [BUNDLE]
#
# TEXT: the plain text the prompts are cut from (../shared/data/pride_and_prejudice.txt);
# OUT: default validation/vllm-eagle-cpu; BUNDLE: an existing `calibrate --engine vllm --head`
# bundle (default: calibration/cpu-vllm/smollm2-135m-eagle1, calibrated first if missing: about
# an hour, so that the runs are priced by the hour they ran in). Needs .vllm-venv and
# runs/smollm2-hf (scripts/setup-vllm-cpu.sh). The servers start afresh for every setting, without
# speculation, with the head, and without again (--interleave --bracket): 36 server starts, about
# 40 minutes on a 2-core CPU. Run nothing else on the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:?usage: scripts/validate-vllm-eagle.sh TEXT [OUT] [BUNDLE]}
out=${2:-validation/vllm-eagle-cpu}
bundle=${3:-calibration/cpu-vllm/smollm2-135m-eagle1}
model=runs/smollm2-hf
head=runs/smollm2-eagle1-vllm
if [ ! -f "$head/config.json" ]; then
    python -m profiler export-hf --head heads/smollm2-135m-eagle1 --out "$head"
fi
if [ ! -f "$bundle/meta.json" ]; then
    python -m profiler calibrate --engine vllm --model "$model" --head "$head" --out "$bundle"
fi
# The prompts start past the text's first 12,288 tokens, whose excerpts the head was trained on.
common=(--engine vllm --model "$model" --method eagle --head "$head" --k 4 --baseline --interleave --bracket
        --text "$text" --text-start 12288 --max-new-tokens 64 --max-model-len 4096)
rm -rf "$out/c512" "$out/c2048" "$out/poisson"
python -m profiler serve-live "${common[@]}" --context 512 --batch 1 2 4 8 16 --limit 4 4 8 16 24 \
    --out "$out/c512" >/dev/null
python -m profiler serve-live "${common[@]}" --context 2048 --batch 1 2 4 8 16 --limit 4 4 8 16 24 \
    --out "$out/c2048" >/dev/null
python -m profiler serve-live "${common[@]}" --context 512 --rate 0.5 2 --limit 16 --out "$out/poisson" >/dev/null
# The docs' table is the committed study's: another OUT writes its validation.csv only.
docs=()
if [ "$out" = validation/vllm-eagle-cpu ]; then docs=(--docs docs/validation-servers.md); fi
python -m sim validate "$out"/c512/ "$out"/c2048/ "$out"/poisson/ --calibration "$bundle" --out "$out" \
    "${docs[@]}"
