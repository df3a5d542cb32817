#!/usr/bin/env bash
# The review-agent quality tables of bench/README.md for one sample, on two splits, end to end and
# resumable:
#
#   bash bench/quality.sh amazon            # about an hour each on 2 CPU cores
#   bash bench/quality.sh yelp runs/quality/yelp
#   VISIBILITY=official bash bench/quality.sh amazon runs/quality/amazon_official
#   SPLITS=temporal bash bench/quality.sh amazon   # one split (suite_50 runs with the leave-last-out one)
#   PREP_ONLY=1 bash bench/quality.sh amazon       # the store, tasks and validation only (seconds; what
#                                                  # bench/quality_recipe.sh needs), no training or suites
#
# Per split (SPLIT): leave-last-out `all` (each user's latest review, every user with >= 2 older ones)
# and `temporal` (every review from the latest day that leaves at least 100 eligible tasks on; the day
# is in tasks_temporal/manifest.json):
# 1. tasks_SPLIT, and val_SPLIT drawn like them from before them (data_prep.split --validation-for:
#    leave-last-out, each task user's previous review; temporal, a temporal split of what precedes the
#    cutoff); both manifests count the new items (no older review of the item);
# 2. training pairs with both folders' pairs blocked (and, temporal, nothing from the test period), the
#    demo recipe (configs/sft/smollm2_cpu.yaml, 50 steps) on them: sft_SPLIT;
# 3. stats, stats-mbr, tuned and tuned-write with that adapter and the model-free baselines, stats-mbr's
#    selection and tuned-write's utility chosen on val_SPLIT (eval.review.suite --validation): suite_SPLIT.
# Plus suite_50: the LLM agents without selection (asc-baseline, retrieval-llm, tuned) on the first 50
# leave-last-out tasks. bench/quality_recipe.sh adds the CPU quality adapter's rows on both splits.
# Each step resumes or skips finished work and redoes a run whose inputs changed (a new selection rule or
# adapter: --overwrite); the suites write compare.md, agents.md and claims.md.
set -euo pipefail
SAMPLE=${1:?usage: quality.sh amazon|yelp [OUT]}
OUT=${2:-runs/quality/$SAMPLE}
PY=${PY:-.venv/bin/python}
RAW=${USERSIM_RAW:-../shared/data/raw}
VISIBILITY=${VISIBILITY:-time-aware}
SPLITS=${SPLITS:-all temporal}
PREP_ONLY=${PREP_ONLY:-0}
case "$SAMPLE" in
    amazon) BUILD=(--source amazon2018 --input "$RAW/amazon2018_5core_small") ;;
    yelp) BUILD=(--source asc --platform yelp --input "$RAW/yelp_asc_sample") ;;
    *) echo "error: unknown sample $SAMPLE (amazon or yelp)" >&2; exit 2 ;;
esac
set -x
"$PY" -m data_prep.build "${BUILD[@]}" --out "$OUT/data"
"$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/tasks_all" --min-history 2 --seed 0 --overwrite
"$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/tasks_temporal" --strategy temporal --cutoff latest:100 \
    --min-history 2 --seed 0 --overwrite
"$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/tasks_50" --min-history 2 --max-tasks 50 --seed 0 --overwrite
for SPLIT in $SPLITS; do
    "$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/val_$SPLIT" --validation-for "$OUT/tasks_$SPLIT" \
        --min-history 2 --seed 0 --overwrite
    [[ "$PREP_ONLY" == 1 ]] && continue
    # rebuilt every time (seconds; the same inputs give the same pairs), so train.sft's fingerprint sees
    # what they were made from: the same resumes or skips, other inputs retrain (--overwrite true)
    "$PY" -m data_prep.pairs --data "$OUT/data" --tasks "$OUT/val_$SPLIT" --out "$OUT/pairs_$SPLIT" \
        --k-user 2 --k-item 1 --max-tokens 256
    "$PY" -m train.sft --config configs/sft/smollm2_cpu.yaml --pairs "$OUT/pairs_$SPLIT" \
        --output_dir "$OUT/sft_$SPLIT" --overwrite true
    "$PY" -m eval.review.suite --kinds stats stats-mbr tuned tuned-write --data "$OUT/data" --tasks "$OUT/tasks_$SPLIT" \
        --validation "$OUT/val_$SPLIT" --adapter "$OUT/sft_$SPLIT" --out "$OUT/suite_$SPLIT" --visibility "$VISIBILITY" --overwrite
done
[[ " $SPLITS " == *" all "* && "$PREP_ONLY" != 1 ]] || exit 0
"$PY" -m eval.review.suite --kinds stats asc-baseline retrieval-llm tuned --data "$OUT/data" --tasks "$OUT/tasks_50" \
    --adapter "$OUT/sft_all" --out "$OUT/suite_50" --visibility "$VISIBILITY" --overwrite
