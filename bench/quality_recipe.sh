#!/usr/bin/env bash
# The CPU quality recipe (configs/sft/smollm2_cpu_quality.yaml, about 4 hours of training per split) on both
# samples and both splits, beside the demo recipe's rows of bench/quality.sh:
#
#   bash bench/quality.sh amazon && bash bench/quality.sh yelp     # first: samples, tasks, validation
#   bash bench/quality_recipe.sh                                    # then: about 11 hours on 2 CPU cores
#   SPLITS=all bash bench/quality_recipe.sh                         # leave-last-out only
#   SPLITS=all SAMPLES=yelp bash bench/quality_recipe.sh            # one sample's suite (the adapter
#                                                                   # still trains on both samples' pairs)
#
# Per split (all: leave-last-out; temporal): 1. pairs from both samples, each blocking its own tasks and
# validation tasks (and, temporal, keeping out its test period), 4 user and 2 item reviews, 512 tokens;
# 2. the quality recipe on them: runs/quality/sft_quality_SPLIT (loss.png, samples/); 3. per sample,
# stats, stats-mbr, tuned and tuned-write with that adapter and the prompt shape it was trained on,
# stats-mbr's selection and tuned-write's utility chosen on the sample's val_SPLIT: suite_quality_SPLIT.
# Every step resumes or skips finished work.
set -euo pipefail
PY=${PY:-.venv/bin/python}
Q=runs/quality
SPLITS=${SPLITS:-all temporal}
SAMPLES=${SAMPLES:-amazon yelp}
for S in amazon yelp; do
    for SPLIT in $SPLITS; do
        [[ -f "$Q/$S/val_$SPLIT/manifest.json" ]] || {
            echo "error: $Q/$S/val_$SPLIT is missing: run bash bench/quality.sh $S first" >&2
            exit 2; }
    done
done
set -x
for SPLIT in $SPLITS; do
    # rebuilt every time (seconds); train.sft resumes or skips the same inputs and retrains other ones
    "$PY" -m data_prep.pairs --data "$Q/amazon/data" "$Q/yelp/data" --tasks "$Q/amazon/val_$SPLIT" \
        "$Q/yelp/val_$SPLIT" --out "$Q/pairs_quality_$SPLIT" --k-user 4 --k-item 2 --max-tokens 512
    "$PY" -m train.sft --config configs/sft/smollm2_cpu_quality.yaml --pairs "$Q/pairs_quality_$SPLIT" \
        --output_dir "$Q/sft_quality_$SPLIT" --overwrite true
    for S in $SAMPLES; do
        "$PY" -m eval.review.suite --kinds stats stats-mbr tuned tuned-write --data "$Q/$S/data" --tasks "$Q/$S/tasks_$SPLIT" \
            --validation "$Q/$S/val_$SPLIT" --adapter "$Q/sft_quality_$SPLIT" --out "$Q/$S/suite_quality_$SPLIT" \
            --max-new-tokens 128 --set k_user=4 k_item=2 prompt_tokens=512 --overwrite
    done
done
