"""An AgentSociety Challenge user-modelling agent, written for the official websocietysimulator package
and run unchanged by this project (docs/bring_your_own.md):

    python -m agents.review run --agent docs/examples/agentsociety_agent.py:HistoryAgent \\
        --data runs/demo/data/amazon --tasks runs/demo/tasks/amazon --out runs/byo/history_agent --limit 20

It imports nothing from this project. Stars: the user's mean over the reviews the tool shows (time-aware
by default: only those older than the task), else the item's; review: the LLM writes it from the user's
last review and the item's name.
"""

from websocietysimulator.agent import SimulationAgent
from websocietysimulator.llm import LLMBase


class HistoryAgent(SimulationAgent):
    def __init__(self, llm: LLMBase):
        super().__init__(llm=llm)

    def workflow(self):
        user_id, item_id = self.task["user_id"], self.task["item_id"]
        item = self.interaction_tool.get_item(item_id=item_id) or {}
        mine = self.interaction_tool.get_reviews(user_id=user_id)
        theirs = self.interaction_tool.get_reviews(item_id=item_id)
        known = [r["stars"] for r in mine] or [r["stars"] for r in theirs] or [4.0]
        stars = float(round(sum(known) / len(known)))
        last = mine[-1]["text"][:400] if mine else "(no earlier review)"
        name = item.get("name") or item.get("title") or "this item"
        review = self.llm(
            messages=[
                {
                    "role": "system",
                    "content": "You write one short product or place review, in the first person.",
                },
                {
                    "role": "user",
                    "content": f"My last review: {last}\n\nWrite my review of {name}, which I rate {stars:.0f} of 5.",
                },
            ],
            temperature=0.0,
            max_tokens=120,
        )
        return {"stars": stars, "review": review.strip() or f"{name}: {stars:.0f} stars."}
