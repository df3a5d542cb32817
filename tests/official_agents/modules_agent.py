"""A challenge entry in the official style, built on websocietysimulator's agent modules: a fixed plan
(PlanningBase), one reasoning call (ReasoningBase) and a memory of the item's reviews (MemoryDILU, or
another memory module of the package). It imports nothing from this project; its helper lives in the
file beside it, as a submission split in two files would."""

import re

from prompt_parts import REVIEW_FORMAT
from websocietysimulator.agent import SimulationAgent
from websocietysimulator.agent.modules.memory_modules import (
    MemoryDILU,
    MemoryGenerative,
    MemoryTP,
    MemoryVoyager,
)
from websocietysimulator.agent.modules.planning_modules import PlanningBase
from websocietysimulator.agent.modules.reasoning_modules import ReasoningBase
from websocietysimulator.llm import LLMBase


class LookUpFirst(PlanningBase):
    """No LLM call: first the user, then the business."""

    def __init__(self, llm):
        super().__init__(llm=llm)

    def __call__(self, task_description):
        self.plan = [
            {
                "description": "find the user",
                "reasoning instruction": "None",
                "tool use instruction": task_description["user_id"],
            },
            {
                "description": "find the business",
                "reasoning instruction": "None",
                "tool use instruction": task_description["item_id"],
            },
        ]
        return self.plan


class WriteOnce(ReasoningBase):
    def __init__(self, profile_type_prompt, llm):
        super().__init__(profile_type_prompt=profile_type_prompt, memory=None, llm=llm)

    def __call__(self, task_description: str):
        messages = [{"role": "user", "content": task_description}]
        return self.llm(messages=messages, temperature=0.0, max_tokens=300)


class WithMemoryDILU(SimulationAgent):
    memory_module = MemoryDILU

    def __init__(self, llm: LLMBase):
        super().__init__(llm=llm)
        self.planning = LookUpFirst(llm=self.llm)
        self.reasoning = WriteOnce(profile_type_prompt="", llm=self.llm)
        self.memory = self.memory_module(llm=self.llm)

    def workflow(self):
        user, item = None, None
        for step in self.planning(task_description=self.task):
            if "user" in step["description"]:
                user = self.interaction_tool.get_user(user_id=self.task["user_id"])
            else:
                item = self.interaction_tool.get_item(item_id=self.task["item_id"])
        for review in self.interaction_tool.get_reviews(item_id=self.task["item_id"]):
            self.memory(f"review: {review['text']}")
        mine = self.interaction_tool.get_reviews(user_id=self.task["user_id"])
        recalled = self.memory(mine[0]["text"]) if mine else ""
        task = REVIEW_FORMAT.format(user=user["user_id"], item=item["item_id"], recalled=recalled)
        answer = self.reasoning(task)
        stars = float(re.search(r"stars:\s*([0-9.]+)", answer).group(1))
        review = re.search(r"review:\s*(.+)", answer, re.S).group(1).strip()
        return {"stars": stars, "review": review}


class WithMemoryGenerative(WithMemoryDILU):
    memory_module = MemoryGenerative


class WithMemoryTP(WithMemoryDILU):
    memory_module = MemoryTP


class WithMemoryVoyager(WithMemoryDILU):
    memory_module = MemoryVoyager
