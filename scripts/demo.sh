#!/usr/bin/env bash
# The main job on built-in synthetic data: generate a world, split it, describe it.
# Run through `./run demo` (which prepares .venv first). Output: runs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
PINGCTL=".venv/bin/pingctl"
OUT="${PINGCTL_DEMO_DIR:-runs/demo}"
ROWS="${PINGCTL_DEMO_ROWS:-2000000}"

step() { printf '\n\033[1;36m==> %s\033[0m\n' "$*"; }

step "pingctl synth: $ROWS synthetic RIPE-Atlas-like ping rows with ground truth"
$PINGCTL synth -o "$OUT/synth" --rows "$ROWS" --seed 0

step "pingctl shard: train/val/test by time (the last 10% of time is test)"
$PINGCTL shard "$OUT/synth" -o "$OUT/splits" --strategy time --val 0.1 --test 0.1

step "pingctl inspect: the splits"
$PINGCTL inspect "$OUT/splits" --sample 3

printf '\n\033[1;32mdone\033[0m: data in %s (synth/ canonical table + truth/, splits/ train val test)\n' "$OUT"
