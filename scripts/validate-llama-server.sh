#!/usr/bin/env bash
# The simulator against llama.cpp's server: llama-server serving SmolLM2's Q4_1 GGUF with 16 slots,
# its n-gram drafter (ngram-simple, 2-token lookup) at k = 2, 4, 6 and no speculation, closed loops
# at batch 1-16 on 512- and 2,048-token prompts and Poisson arrivals at two rates, predicted from a
# black-box calibration of that server with acceptance from each run's own counters and fitted on
# the others (docs/validation-servers.md). llama.cpp prefills about 270 tokens/s on 2 cores (a third of
# vLLM's rate), so the 2,048-token runs take half vLLM's prompts, and the Poisson rates, 0.15 and
# 0.3 requests/s, load the server about a third and two thirds of the way to what it can prefill.
#
#   scripts/validate-llama-server.sh TEXT [OUT] [BUNDLE]
#
# TEXT: the plain text the prompts are cut from (../shared/data/pride_and_prejudice.txt);
# OUT: default validation/llama-cpp-cpu; BUNDLE: an existing `calibrate --engine llama.cpp` bundle
# (default calibration/cpu-llama-cpp/smollm2-135m). A missing BUNDLE brackets the study as the
# baselines bracket its speculative runs: BUNDLE-before is calibrated before the runs and
# BUNDLE-after after them (about 30 minutes each), and BUNDLE is the two pooled (`calibrate --pool`).
# Needs .llama-server (scripts/build-llama-server.sh). The servers start afresh for every setting,
# its drafters back to back (--interleave) between a baseline before and one after (--bracket), so
# each speedup is over the mean of two baselines minutes from it. About 55 minutes on a 2-core CPU
# (two hours with the bundles); run nothing else on the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:?usage: scripts/validate-llama-server.sh TEXT [OUT] [BUNDLE]}
out=${2:-validation/llama-cpp-cpu}
bundle=${3:-calibration/cpu-llama-cpp/smollm2-135m}
bracket_bundle=
if [ ! -f "$bundle/meta.json" ]; then
    bracket_bundle=1
    rm -rf "$bundle-before" "$bundle-after"
    python -m profiler calibrate --engine llama.cpp --model smollm2 --out "$bundle-before"
fi
common=(--engine llama.cpp --model smollm2 --method ngram --k 2 4 6 --baseline --interleave --bracket --parallel 16
        --text "$text" --max-new-tokens 64 --max-model-len 4096)
rm -rf "$out/c512" "$out/c2048" "$out/poisson"
python -m profiler serve-live "${common[@]}" --context 512 --batch 1 2 4 8 16 --limit 4 4 8 16 24 \
    --out "$out/c512" >/dev/null
python -m profiler serve-live "${common[@]}" --context 2048 --batch 1 2 4 8 16 --limit 2 2 4 8 16 \
    --out "$out/c2048" >/dev/null
python -m profiler serve-live "${common[@]}" --context 512 --rate 0.15 0.3 --limit 12 --out "$out/poisson" >/dev/null
if [ -n "$bracket_bundle" ]; then
    python -m profiler calibrate --engine llama.cpp --model smollm2 --out "$bundle-after"
    python -m profiler calibrate --pool "$bundle-before" "$bundle-after" --out "$bundle"
fi
# The docs' table is the committed study's: another OUT writes its validation.csv only.
docs=()
if [ "$out" = validation/llama-cpp-cpu ]; then docs=(--docs docs/validation-servers.md); fi
python -m sim validate "$out"/c512/ "$out"/c2048/ "$out"/poisson/ --calibration "$bundle" --out "$out" \
    "${docs[@]}"
