#!/usr/bin/env bash
# The CPU quality recipe (issue 13) against the demo recipe, on every eligible task of both samples:
#
#   bash bench/quality.sh amazon && bash bench/quality.sh yelp     # first: samples, tasks, 50-step runs
#   bash bench/quality_recipe.sh                                    # then: about 2 hours on 2 CPU cores
#   VISIBILITY=official bash bench/quality_recipe.sh                # the same adapter, official visibility
#   SAMPLES=yelp VISIBILITY=official bash bench/quality_recipe.sh   # one sample only
#
# 1. pairs from both samples (each blocks its own tasks_all), 4 user and 2 item reviews, 512 tokens;
# 2. configs/sft/smollm2_cpu_quality.yaml (about an hour): loss.png, samples/ in runs/quality/sft_quality;
# 3. per sample, stats, stats-mbr and tuned-mbr with that adapter and the prompt shape it was trained on
#    (tuned-mbr keeps its greedy answer, so the plain tuned agent is scored from the same run: pool answer);
# 4. the pool ablation against stats, stats-mbr, nearest-centroid and the 50-step adapter's runs.
# Every step resumes or skips finished work. With VISIBILITY=official the suites and the ablation write to
# suite_quality_official and selection_quality_official, against the 50-step adapter's official runs in
# suite_all_official (made by the eval.suite command of bench/README.md, "official visibility").
set -euo pipefail
PY=${PY:-.venv/bin/python}
Q=runs/quality
VISIBILITY=${VISIBILITY:-time-aware}
SAMPLES=${SAMPLES:-amazon yelp}
case $VISIBILITY in
    time-aware) SUFFIX= ;;
    official) SUFFIX=_official ;;
    *) echo "error: VISIBILITY is time-aware or official, not $VISIBILITY" >&2; exit 2 ;;
esac
for S in $SAMPLES; do
    [[ -f "$Q/$S/suite_all$SUFFIX/eval/tuned-mbr/results.json" ]] || {
        echo "error: $Q/$S/suite_all$SUFFIX is missing: the 50-step adapter's runs come first (bench/README.md)" >&2
        exit 2; }
done
set -x
[[ -f "$Q/pairs_quality/card.json" ]] || "$PY" -m data_prep.pairs --data "$Q/amazon/data" "$Q/yelp/data" \
    --tasks "$Q/amazon/tasks_all" "$Q/yelp/tasks_all" --out "$Q/pairs_quality" --k-user 4 --k-item 2 --max-tokens 512
[[ -f "$Q/sft_quality/training_card.json" ]] || "$PY" -m train.sft --config configs/sft/smollm2_cpu_quality.yaml
for S in $SAMPLES; do
    "$PY" -m eval.suite --kinds stats stats-mbr tuned-mbr --data "$Q/$S/data" --tasks "$Q/$S/tasks_all" \
        --adapter "$Q/sft_quality" --out "$Q/$S/suite_quality$SUFFIX" --max-new-tokens 128 \
        --set k_user=4 k_item=2 prompt_tokens=512 --visibility "$VISIBILITY"
    E="$Q/$S/suite_quality$SUFFIX/eval"
    D="$Q/$S/suite_all$SUFFIX/eval"
    DEMO_TUNED=()  # the official 50-step runs have no greedy tuned run
    [[ $VISIBILITY == official ]] || DEMO_TUNED=(demo-tuned="$D/tuned")
    "$PY" -m bench.selection_bench --run "$Q/$S/suite_quality$SUFFIX/sim/tuned-mbr" --data "$Q/$S/data" \
        --tasks "$Q/$S/tasks_all" --out "$Q/$S/selection_quality$SUFFIX" --against stats="$E/stats" \
        stats-mbr="$E/stats-mbr" nearest-centroid="$E/nearest-centroid" ${DEMO_TUNED[@]+"${DEMO_TUNED[@]}"} demo-tuned-mbr="$D/tuned-mbr"
done
