"""Instruction text shared by the procedural datasets."""

# No worked number in the instruction: small models copy it (SmolLM2-135M answers "\boxed{42}" to every
# question when the instruction shows one); with a placeholder it boxes its own result about as often.
BOXED_INSTRUCTION = "Write your final answer as \\boxed{ANSWER}."


def user_messages(question: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    return messages
