"""Every sandbox prompt follows one framework: the profile summary relevant to the action, the
retrieved memories, the instruction, and the context (the simulated time and the agent's state)."""

from __future__ import annotations


def frame(profile: str, memories: list[str], instruction: str, context: str) -> list[dict]:
    remembered = "\n".join(f"- {m}" for m in memories) if memories else "- (nothing yet)"
    return [
        {"role": "system", "content": f"You are {profile}. Act as this person would, in their own voice."},
        {
            "role": "user",
            "content": f"# What you remember\n{remembered}\n\n# Now\n{context}\n\n# Task\n{instruction}",
        },
    ]
