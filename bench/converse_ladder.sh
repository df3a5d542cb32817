#!/usr/bin/env bash
# The conversational simulator's known-quality ladder (bench/README.md, "Conversational user simulator"):
# GOALS (default 16) real Yelp users' goals (one each) against random, BaseCRS, AgentCRS, the example HTTP CRS, the
# oracle, and the oracle's places in other words (oracle-ignores: curt, off-topic; oracle-explains: explained
# against the user's stated needs), rated by the simulator on one backbone; then the evaluation (success,
# hit@k, turns to success, objective fit, the three ratings, paired differences, end reasons). Every run
# resumes where it stopped; a recommender added to CRS later runs alone (the others' dialogues are kept).
#   bash bench/converse_ladder.sh                                         # base SmolLM2, runs/converse/ladder-base
#   ADAPTER=runs/converse/sft/smollm2_json NAME=tuned bash bench/converse_ladder.sh   # the tuned backbone
#   RATINGS=off NAME=objective bash bench/converse_ladder.sh              # no ratings: the objective table, minutes
set -euo pipefail
SHARED=${SHARED:-../shared/data/raw}
PY=${PY:-.venv/bin/python}
NAME=${NAME:-base}
GOALS=${GOALS:-16}
OUT=${OUT:-runs/converse/ladder-$NAME}
PORT=${PORT:-8765}
"$PY" -m agents.converse.http_example --catalogue "$SHARED/yelp_asc_sample/item_subset.json" --port "$PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -s -o /dev/null "http://127.0.0.1:$PORT/docs" && break; sleep 0.5; done
SETTINGS=(data="$SHARED/recllmsim" catalogue="$SHARED/yelp_asc_sample/item_subset.json"
    reviews="$SHARED/yelp_asc_sample/review_subset.json" goal_users="$SHARED/yelp_asc_sample/user_subset.json"
    dialogues=$GOALS max_turns=5 "crs=[${CRS:-random, base, agent, web, oracle-ignores, oracle-explains, oracle}]"
    "plugins={web: {transport: http, target: 'http://127.0.0.1:$PORT/respond'}}")
[ -n "${ADAPTER:-}" ] && SETTINGS+=("llm.adapter=$ADAPTER")
[ "${RATINGS:-on}" = off ] && SETTINGS+=("rating.enabled=false")
"$PY" -m agents.converse run --config configs/converse/yelp.yaml --out "$OUT" --set "${SETTINGS[@]}"
"$PY" -m eval.converse --run "$OUT" --data "$SHARED/recllmsim" --out "$OUT/eval"
