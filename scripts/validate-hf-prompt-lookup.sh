#!/usr/bin/env bash
# The simulator against an engine nobody here wrote: Hugging Face transformers' own prompt-lookup
# decoding on SmolLM2 (greedy, batch 1), predicted from a black-box calibration of transformers
# with the acceptance transformers itself measured (replayed), so the predicted speedup rests on
# the black-box timings alone (docs/validation.md).
#
#   scripts/validate-hf-prompt-lookup.sh TEXT [OUT] [BUNDLE]
#
# TEXT: the plain text the 512-token prompts are cut from (../shared/data/pride_and_prejudice.txt);
# OUT: default validation/hf-prompt-lookup; BUNDLE: an existing `calibrate --engine hf` bundle
# (default: calibrate one into OUT/calibration first, about 4 minutes on a 2-core CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:?usage: scripts/validate-hf-prompt-lookup.sh TEXT [OUT] [BUNDLE]}
out=${2:-validation/hf-prompt-lookup}
bundle=${3:-}
if [ -z "$bundle" ]; then
    bundle=$out/calibration
    python -m profiler calibrate --engine hf --threads 2 --out "$bundle"
fi
runs=()
for spec in none:1 ngram:4 ngram:10; do
    method=${spec%%:*} k=${spec##*:}
    run=$out/hf-$method$([ "$method" = ngram ] && echo "-k$k")
    rm -rf "$run"
    python -m profiler hf-live --method "$method" --k "$k" --context 512 --text "$text" --limit 4 \
        --max-new-tokens 96 --threads 2 --out "$run" >/dev/null
    runs+=("$run")
done
python -m sim validate "${runs[@]}" --calibration "$bundle" --out "$out"
