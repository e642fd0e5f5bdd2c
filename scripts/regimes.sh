#!/usr/bin/env bash
# The regimes experiment (docs/eval.md, "./run regimes: the recipe from nothing"): one model per world trained on a
# `shard --strategy regimes` split with two-sided (triangulation) prompts, then evaluated on the
# four test sets — time, held-out pairs, unseen probes, unseen destinations — against the best
# classical predictor with the same information in each.
#
# Worlds (PINGCTL_REGIMES_WORLDS, space-separated, default all three):
#   real    the shared RIPE Atlas samples (../shared/data/ripe-atlas, or PINGCTL_REGIMES_RIPE)
#   sparse  a pingctl synth world where each probe measures few of many targets
#   random  the same world with addresses that carry no place, AS or prefix
#   seattle the shared real 99-host latency matrix (../shared/data/seattle, or
#           PINGCTL_REGIMES_SEATTLE): a canonical table already, addresses that carry no place
#
# Run through `./run regimes` (which prepares .venv first). Output: runs/regimes/WORLD/.
# Interrupted? Run it again: finished stages are kept (each is renamed into place only when
# complete) and training resumes from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
PINGCTL="${PINGCTL_BIN:-.venv/bin/pingctl}"
PYTHON="${PINGCTL_PYTHON:-.venv/bin/python}"
OUT="${PINGCTL_REGIMES_DIR:-runs/regimes}"
WORLDS="${PINGCTL_REGIMES_WORLDS:-real sparse random}"
RIPE="${PINGCTL_REGIMES_RIPE:-../shared/data/ripe-atlas}"
SEATTLE="${PINGCTL_REGIMES_SEATTLE:-../shared/data/seattle}"
ROWS="${PINGCTL_REGIMES_ROWS:-2000000}"        # synth worlds' packets
PROBES="${PINGCTL_REGIMES_PROBES:-600}"
TARGETS="${PINGCTL_REGIMES_TARGETS:-300}"
PER_PROBE="${PINGCTL_REGIMES_PER_PROBE:-24}"    # sparse: each probe measures 24 of the targets
PRESET="${PINGCTL_REGIMES_PRESET:-mini}"
STEPS="${PINGCTL_REGIMES_STEPS:-3000}"
MINUTES="${PINGCTL_REGIMES_MINUTES:-80}"
BATCH="${PINGCTL_REGIMES_BATCH:-16}"
SHARE="${PINGCTL_REGIMES_SHARE:-0.5}"          # loader.triangulation_share
PAIR_SHARE="${PINGCTL_REGIMES_PAIR_SHARE:-0.25}" # loader.pair_history_share: the time regime's prompt shape
K="${PINGCTL_REGIMES_K:-16}"                    # context measurements a side
QUERIES="${PINGCTL_REGIMES_QUERIES:-1000}"
HARDWARE="${PINGCTL_REGIMES_HARDWARE:-cpu}"
HINTS="${PINGCTL_REGIMES_HINTS:-1}"             # triangulation contexts carry the embedding's estimate (pingctl hints); 0: off
# with hints: a hinted query's RTT relative to its hint (loader.relative_target): 1 on, 0 off, auto (the
# default) on where the hints are close, their cross-fitted median error (`pingctl hints`'s
# estimate_median_rel_err) at most RELATIVE_MAX_ERR: relative to a poor hint the model does worse
# (measured: docs/eval.md, "./run regimes")
RELATIVE="${PINGCTL_REGIMES_RELATIVE:-auto}"
RELATIVE_MAX_ERR="${PINGCTL_REGIMES_RELATIVE_MAX_ERR:-0.12}"
PERIOD="${PINGCTL_REGIMES_PERIOD:-$(( STEPS / 4 > 0 ? STEPS / 4 : 1 ))}"  # checkpoint and eval interval

step() { printf '\n\033[1;36m==> %s\033[0m\n' "$*"; }

trained() {  # the run directory's summary says all $STEPS steps are done
  "$PYTHON" - "$1/summary.json" "$STEPS" <<'PY' 2>/dev/null
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["last_step"] + 1 >= int(sys.argv[2]) else 1)
PY
}

for world in $WORLDS; do
  W="$OUT/$world"
  TABLE="$W/table"
  [ "$world" = seattle ] && TABLE="$SEATTLE"   # read in place: shard never writes into its input
  if [ ! -d "$TABLE" ]; then
    case "$world" in
      real)
        step "$world: pingctl ingest $RIPE"
        $PINGCTL ingest "$RIPE" -o "$W/table" ;;
      sparse|random)
        addresses=structured; [ "$world" = random ] && addresses=random
        step "$world: pingctl synth, $PROBES probes x $PER_PROBE of $TARGETS targets, $addresses addresses"
        $PINGCTL synth -o "$W/table" --rows "$ROWS" --probes "$PROBES" --targets "$TARGETS" \
          --targets-per-probe "$PER_PROBE" --addresses "$addresses" --seed 1 ;;
      seattle) echo "no Seattle table at $SEATTLE (set PINGCTL_REGIMES_SEATTLE)" >&2; exit 2 ;;
      *) echo "unknown world $world (real, sparse, random, seattle)" >&2; exit 2 ;;
    esac
  fi
  if [ ! -d "$W/splits" ]; then
    step "$world: pingctl shard --strategy regimes"
    $PINGCTL shard "$TABLE" -o "$W/splits" --strategy regimes
  fi
  for split in train val; do
    if [ ! -d "$W/rows/$split" ]; then
      step "$world: pingctl build-rows $split --by both"
      $PINGCTL build-rows "$W/splits/$split" -o "$W/rows/$split" --by both
    fi
  done
  hint_args=()
  if [ "$HINTS" = 1 ]; then
    if [ ! -f "$W/hints.npz" ] || [ ! -f "$W/hints.json" ]; then
      step "$world: pingctl hints (the embedding's cross-fitted estimates, for the triangulation contexts)"
      $PINGCTL hints "$W/splits/train" -o "$W/hints.npz" --json > "$W/hints.json.tmp"
      mv "$W/hints.json.tmp" "$W/hints.json"
    fi
    hint_args=(--set loader.hints_file="$W/hints.npz")
    relative="$RELATIVE"
    if [ "$RELATIVE" = auto ]; then
      read -r relative err < <("$PYTHON" - "$W/hints.json" "$RELATIVE_MAX_ERR" <<'PY'
import json, sys
err = json.load(open(sys.argv[1]))["estimate_median_rel_err"]
print(1 if err is not None and err <= float(sys.argv[2]) else 0, "unknown" if err is None else f"{err:.1%}")
PY
)
      echo "$world: hints $err off the train pairs' medians: relative target" \
        "$([ "$relative" = 1 ] && echo on || echo off) (on at most $RELATIVE_MAX_ERR)"
    fi
    [ "$relative" = 1 ] && hint_args+=(--set loader.relative_target=true)
  fi
  if ! trained "$W/train"; then
    step "$world: pingctl train $PRESET, $STEPS steps, triangulation share $SHARE, $K a side"
    $PINGCTL train "$W/rows/train" --eval "$W/rows/val" --preset "$PRESET" --steps "$STEPS" \
      -o "$W/train" --max-minutes "$MINUTES" --hardware "$HARDWARE" \
      --set loader.seq_len=512 --set loader.batch_size="$BATCH" --set train.learning_rate=0.001 \
      --set train.checkpoint_period="$PERIOD" --set train.eval_interval="$PERIOD" \
      --set loader.result_last=1 --set loader.max_per_pair=1 --set "loader.mode_weights=[0,0,1]" \
      --set loader.triangulation_share="$SHARE" --set loader.triangulation_k_src="$K" \
      --set loader.triangulation_k_dst="$K" --set loader.pair_history_share="$PAIR_SHARE" \
      --set loader.pair_history_k="$K" \
      --set "model.overrides={adam_weight_decay: 1.0}" "${hint_args[@]}"
    trained "$W/train" || echo "note: stopped at the ${MINUTES}-minute bound before step $STEPS;" \
      "the eval below is of the last checkpoint. Run this again to continue training."
  fi
  if [ ! -f "$W/eval/report.json" ]; then
    step "$world: pingctl eval --regimes, fair prompts: the pair's $K last packets (time), $K a side (held out)"
    $PINGCTL eval "$W/train" --regimes "$W/splits" --context-policy fair --context "$K" --context-dst "$K" \
      --queries "$QUERIES" --hardware "$HARDWARE" -o "$W/eval"
  fi
done

printf '\n\033[1;32mdone\033[0m: %s/*/eval/report.json (pingctl inspect %s/WORLD/eval)\n' "$OUT" "$OUT"
