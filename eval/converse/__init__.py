"""Evaluate a conversational simulator run (agents.converse): the recommenders' ratings, and how the
simulated users compare with RecLLMSim's LLM users and real people.

    python -m eval.converse --run runs/converse/demo --out runs/converse/demo/eval

- **Ratings per recommender**: the mean of each rating (language, action, recommendation quality) with
  a 95% bootstrap interval over dialogues (each dialogue's mean first), and the paired difference
  between two recommenders that talked to the same personas (dialogue ids pair them).
- **Realism**: user turns per dialogue, words per user turn and the intent mix (the common vocabulary
  of data_prep.recllmsim) of the simulated users against RecLLMSim's LLM users (English) and real
  people (Chinese); each turn counts each of its intents once (the people's turns may carry several,
  the simulator's up to two actions; ask_plan maps to "plan"). Lengths are compared within a language only: the simulated users' English words
  against the LLM users' English; the people's Chinese characters are reported beside their LLM users'
  Chinese translations (``content_zh``), never against English. Kolmogorov-Smirnov statistics for the
  distributions, total variation distance for the intent mix.
- **Controllability**: words per user turn as sent (after the refinement tools) by the persona's
  message-length setting (short personas should write the shortest turns: the means are reported in
  order, with a chart), and each tool's judged level against the persona's level (the tools run in
  order, so a later tool judges the message as the earlier ones left it).

- **Profile identification transfer**: a gender classifier (TF-IDF + logistic regression) trained on
  the simulated users' turns and scored on RecLLMSim's LLM users (English), beside the reference
  figure (trained on the LLM users' Chinese translations, scored on the real people), each with the
  majority-class accuracy.

Writes OUT/results.json, OUT/table.md, OUT/lengths.png and OUT/traits.png (per refinement tool, the
judged levels by the persona's level).

    python -m eval.converse --replay llm --limit 60 --out runs/converse/replay-base
    python -m eval.converse --replay llm --limit 60 --set llm.adapter=runs/converse/sft/smollm2_json \
        --out runs/converse/replay-tuned
    python -m eval.converse --consistency runs/converse/replay-base/replay_llm.json runs/converse/replay-tuned/replay_llm.json
    python -m eval.converse --replay human --questionnaire-only --out runs/converse/agreement-base

- **The people's questionnaire** (``--replay human --questionnaire-only``): the simulator fills it for
  each real-person conversation; kept batch by batch in OUT/questionnaire_answers.jsonl, so a stopped
  run resumes (and refuses to resume under other settings).
- **Replay** (``--replay llm|human``): the simulator rates the assistant turns of recorded
  conversations; its conversation-level ratings against RecLLMSim's 7 ratings (LLM users) or the
  people's questionnaires (ordinal), Spearman and Pearson with p-values and person-clustered
  intervals (``replay_check``).
- **Agreement per backbone** (``--agreement DIR [DIR...]``): the questionnaire-only folders' answers
  against the people's, per item, and each later backbone against the first as paired differences in
  Spearman (``agreement``); ``--out`` keeps agreement.json and agreement.md.
- **Ladders of two backbones** (``--ladders A B``): two bench/converse_ladder.sh runs of the same
  goals; per rating, each goal's oracle − random gap on each backbone and B's gap minus A's, paired
  over goals (``ladders``): whether a backbone tells good from bad better. ``--low oracle-ignores
  --high oracle-explains`` compares the rungs that differ only in words (language and action).
- **Consistency across backbones** (``--consistency A B``): two replays of the same conversations,
  their conversation-level ratings correlated per rating.

``training_check`` holds the task metric the converse recipe evaluates during training (eval.training).
"""

from __future__ import annotations

from eval.converse.agreement import agreement, agreement_table  # noqa: F401
from eval.converse.common import KEYS, interval  # noqa: F401
from eval.converse.ladders import LADDER_KEYS, ladders, ladders_table  # noqa: F401
from eval.converse.realism import gender_of, identification, realism, transfer  # noqa: F401
from eval.converse.replay import (  # noqa: F401
    QUESTIONNAIRE,
    bootstrap_p,
    clustered_correlation,
    consistency,
    holm,
    item_agreement,
    questionnaire_answers,
    replay_check,
)
from eval.converse.run import (  # noqa: F401
    ENDINGS,
    GOAL_KEYS,
    count_of,
    evaluate,
    goal_metrics,
    outcomes,
    per_crs_lines,
    ratings,
    table,
)
