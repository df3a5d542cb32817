#!/usr/bin/env bash
# The review-agent quality tables of bench/README.md for one sample, end to end and resumable:
#
#   bash bench/quality.sh amazon            # about 35 minutes on 2 CPU cores, 80 with tuned-mbr
#   bash bench/quality.sh yelp runs/quality/yelp
#   VISIBILITY=official bash bench/quality.sh amazon runs/quality/amazon_official
#
# 1. build the sample; 2. two task folders from one seeded shuffle: every eligible task (users with
# >= 2 older reviews) and its first 50; 3. training pairs with *every* eligible task blocked, and the
# CPU LoRA recipe on them, so the adapter has seen none of the tasks it is scored on; 4. all agents and
# the baselines on the 50 tasks; 5. stats, tuned and tuned-mbr (and the baselines) on every eligible
# task; 6. the candidate-pool ablation of tuned-mbr (bench/selection_bench.py); 7. a temporal split
# beside leave-last-out: every review from the latest day that leaves at least 100 eligible tasks on (the
# day is in tasks_temporal/manifest.json), with its own adapter trained only on reviews before that day,
# and the agents and baselines on it (suite_temporal; its tables show the share of new items).
# Each step resumes or skips finished work; the suites write compare.md, agents.md and claims.md.
set -euo pipefail
SAMPLE=${1:?usage: quality.sh amazon|yelp [OUT]}
OUT=${2:-runs/quality/$SAMPLE}
PY=${PY:-.venv/bin/python}
RAW=${USERSIM_RAW:-../shared/data/raw}
VISIBILITY=${VISIBILITY:-time-aware}
case "$SAMPLE" in
    amazon) BUILD=(--source amazon2018 --input "$RAW/amazon2018_5core_small") ;;
    yelp) BUILD=(--source asc --platform yelp --input "$RAW/yelp_asc_sample") ;;
    *) echo "error: unknown sample $SAMPLE (amazon or yelp)" >&2; exit 2 ;;
esac
set -x
"$PY" -m data_prep.build "${BUILD[@]}" --out "$OUT/data"
"$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/tasks_all" --min-history 2 --seed 0 --overwrite
"$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/tasks_50" --min-history 2 --max-tasks 50 --seed 0 --overwrite
[[ -f "$OUT/pairs/card.json" ]] || "$PY" -m data_prep.pairs --data "$OUT/data" --tasks "$OUT/tasks_all" \
    --out "$OUT/pairs" --k-user 2 --k-item 1 --max-tokens 256
"$PY" -m train.sft --config configs/sft/smollm2_cpu.yaml --pairs "$OUT/pairs" --output_dir "$OUT/sft"
"$PY" -m eval.suite --data "$OUT/data" --tasks "$OUT/tasks_50" --adapter "$OUT/sft" \
    --out "$OUT/suite_50" --visibility "$VISIBILITY"
"$PY" -m eval.suite --kinds stats stats-mbr tuned tuned-mbr --data "$OUT/data" --tasks "$OUT/tasks_all" \
    --adapter "$OUT/sft" --out "$OUT/suite_all" --visibility "$VISIBILITY"
E="$OUT/suite_all/eval"
"$PY" -m bench.selection_bench --run "$OUT/suite_all/sim/tuned-mbr" --data "$OUT/data" --tasks "$OUT/tasks_all" \
    --out "$OUT/selection" --against tuned="$E/tuned" stats="$E/stats" nearest-centroid="$E/nearest-centroid"
"$PY" -m data_prep.split --data "$OUT/data" --out "$OUT/tasks_temporal" --strategy temporal --cutoff latest:100 \
    --min-history 2 --seed 0 --overwrite
[[ -f "$OUT/pairs_temporal/card.json" ]] || "$PY" -m data_prep.pairs --data "$OUT/data" --tasks "$OUT/tasks_temporal" \
    --out "$OUT/pairs_temporal" --k-user 2 --k-item 1 --max-tokens 256
"$PY" -m train.sft --config configs/sft/smollm2_cpu.yaml --pairs "$OUT/pairs_temporal" --output_dir "$OUT/sft_temporal"
"$PY" -m eval.suite --kinds stats stats-mbr tuned tuned-mbr --data "$OUT/data" --tasks "$OUT/tasks_temporal" \
    --adapter "$OUT/sft_temporal" --out "$OUT/suite_temporal" --visibility "$VISIBILITY"
