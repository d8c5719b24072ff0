"""Instruction text shared by the procedural datasets."""

BOXED_INSTRUCTION = "Put your final answer in \\boxed{}, for example \\boxed{42}."


def user_messages(question: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    return messages
