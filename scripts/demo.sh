#!/usr/bin/env bash
# The main job on built-in synthetic data: generate a world, split it, build probe rows,
# train a tiny model with MaxText on them, evaluate it against classical predictors and
# ask it one question.
# Run through `./run demo` (which prepares .venv first). Output: runs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
PINGCTL=".venv/bin/pingctl"
OUT="${PINGCTL_DEMO_DIR:-runs/demo}"
ROWS="${PINGCTL_DEMO_ROWS:-2000000}"

step() { printf '\n\033[1;36m==> %s\033[0m\n' "$*"; }

step "pingctl synth: $ROWS synthetic RIPE-Atlas-like ping rows with ground truth"
# 15-minute rounds stretch 2M rows over ~2 days, so daily cycles show up in the data.
$PINGCTL synth -o "$OUT/synth" --rows "$ROWS" --seed 0 --step 900

step "pingctl shard: train/val/test by time (the last 10% of time is test)"
$PINGCTL shard "$OUT/synth" -o "$OUT/splits" --strategy time --val 0.1 --test 0.1

step "pingctl inspect: the splits"
$PINGCTL inspect "$OUT/splits"

for split in train val test; do
  step "pingctl build-rows: $split split -> probe-centric ArrayRecord rows"
  $PINGCTL build-rows "$OUT/splits/$split" -o "$OUT/rows/$split"
done

step "pingctl inspect: the training rows"
$PINGCTL inspect "$OUT/rows/train" --sample 1

step "pingctl train: the tiny preset with MaxText on this CPU (--fresh: the demo starts over)"
$PINGCTL train "$OUT/rows/train" --eval "$OUT/rows/val" --run-dir "$OUT/train" --preset tiny \
  --steps "${PINGCTL_DEMO_STEPS:-300}" --fresh \
  --set loader.seq_len=512 --set loader.batch_size=8 --set train.eval_interval=50 --set train.checkpoint_period=100
echo "loss curve: $OUT/train/loss.png   TensorBoard: tensorboard --logdir $OUT/train/maxtext/tensorboard"

step "pingctl eval on val: fits the recalibration of the model's intervals (calibration.json)"
$PINGCTL eval "$OUT/train" --train "$OUT/splits/train" --test "$OUT/splits/val" \
  --queries "${PINGCTL_DEMO_QUERIES:-48}" -o "$OUT/eval-val" --json >/dev/null
echo "calibration: $OUT/eval-val/calibration.json (pingctl inspect it)"

step "pingctl eval: the model against global/pair/prefix medians and Vivaldi on held-out packets"
$PINGCTL eval "$OUT/train" --train "$OUT/splits/train" --test "$OUT/splits/test" --truth "$OUT/synth" \
  --queries "${PINGCTL_DEMO_QUERIES:-48}" -o "$OUT/eval" --calibration "$OUT/eval-val/calibration.json"

step "what to ask for: the eval's verdict as advice (pingctl.eval.presentation.advice)"
.venv/bin/python - "$OUT/eval/report.json" <<'PY'
import json, sys
from pingctl.eval.presentation import advice
print("\n".join(advice(json.load(open(sys.argv[1])))))
PY

step "pingctl sample: the RTT distribution between two addresses of the test split"
read -r SRC DST < <(.venv/bin/python - "$OUT/splits/test" <<'PY'
import sys, pyarrow.dataset as ds
t = ds.dataset(sys.argv[1]).head(1, columns=["src_addr", "dst_addr"]).to_pylist()[0]
print(t["src_addr"], t["dst_addr"])
PY
)
$PINGCTL sample "$OUT/train" --src "$SRC" --dst "$DST" --plot "$OUT/sample-rtt.png"

printf '\n\033[1;32mdone\033[0m: data in %s (synth/ table + truth/, splits/, rows/, train/, eval/)\n' "$OUT"
