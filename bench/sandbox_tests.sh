#!/usr/bin/env bash
# The sandbox's checks end to end (bench/README.md, "Recommender sandbox"): choice pairs strictly before
# AFTER, the CPU adapter on them (until validation accuracy stops improving), then the three tests on the same 100 users, each with
# the tuned rows. Every step resumes where it stopped when rerun. About 4 hours on 2 cores.
#   bash bench/sandbox_tests.sh                      # ml-latest-small from ../shared
#   DATA=path/to/ml-folder AFTER=2012-01-01 PAIRS=runs/pairs/other ADAPTER=runs/sandbox/sft/other OUT=runs/other \
#       bash bench/sandbox_tests.sh
set -euo pipefail
DATA=${DATA:-../shared/data/raw/movielens_latest_small}
AFTER=${AFTER:-2010-01-01}
OUT=${OUT:-runs/sandbox_tests}
PY=${PY:-.venv/bin/python}
CONFIG=configs/sandbox/movielens.yaml
PAIRS=${PAIRS:-runs/pairs/choices}  # the recipe's folders; another DATA or AFTER wants its own
ADAPTER=${ADAPTER:-runs/sandbox/sft/choice}
# the pairs are rebuilt each time (4 minutes; the same files for the same DATA and AFTER). train.sft
# skips a finished adapter trained on the same inputs, resumes a stopped one, and retrains one whose
# pairs or recipe changed (its fingerprint; --overwrite true), so a stale adapter is never kept
"$PY" -m data_prep.choice_pairs --data "$DATA" --out "$PAIRS" --before "$AFTER" --examples 6000 --ratings 1500
"$PY" -m train.sft --config configs/sft/smollm2_choice_cpu.yaml --pairs "$PAIRS" --output_dir "$ADAPTER" \
    --overwrite true
"$PY" -m eval.sandbox.discrimination --config "$CONFIG" --set "data=$DATA" --out "$OUT/discrimination" \
    --after "$AFTER" --adapter "$ADAPTER"
"$PY" -m eval.sandbox.generation --config "$CONFIG" --set "data=$DATA" --out "$OUT/generation" --after "$AFTER" \
    --adapter "$ADAPTER" --choices-from "$OUT/discrimination/results.json"
"$PY" -m eval.sandbox.alignment --config "$CONFIG" --set "data=$DATA" --out "$OUT/alignment" --after "$AFTER" \
    --adapter "$ADAPTER"
