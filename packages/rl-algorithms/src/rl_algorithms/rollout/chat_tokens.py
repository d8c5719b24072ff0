"""Tokens between model turns, computed from the chat template without re-tokenising what the model wrote.

After a model turn we need the tokens that close the assistant message (what the template puts after
the content, minus the part the model already generated, e.g. its end-of-turn token), the
environment's message, and the header of the next assistant turn. They are the difference between two
renderings of the conversation, which requires the template to be append-only: rendering a longer
conversation must extend, not rewrite, the rendering of a shorter one.
"""

from __future__ import annotations

from typing import Any

_PLACEHOLDER = "\u2063RL-ASSISTANT-CONTENT\u2063"


class TemplateNotAppendOnlyError(ValueError):
    pass


class ChatTokens:
    """Renders and tokenises chat turns for one tokenizer (HF tokenizer with a chat template)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt with the header of the first assistant turn."""
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                 return_dict=False)
        return [int(t) for t in ids]

    def encode_prompt(self, messages: list[dict[str, Any]]) -> list[int] | Any:
        """``prompt_tokens``; for a vision-language model (``rl_core.image_chat_tokenizer``) a chat with images
        gives its ``EncodedChat``."""
        encode = getattr(self.tokenizer, "encode_image_chat", None)
        return encode(messages) if encode is not None else self.prompt_tokens(messages)

    def assistant_closing(self, history: list[dict[str, str]]) -> str:
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        text = self.render([*history, {"role": "assistant", "content": _PLACEHOLDER}])
        return text[text.rindex(_PLACEHOLDER) + len(_PLACEHOLDER):]

    def missing_closing(self, closing: str, generated: list[int]) -> str:
        """The part of ``closing`` the model did not generate itself. The model's last 1-3 tokens may
        already be its start (an end-of-turn token ends generation); they are matched at token
        boundaries only."""
        for count in (3, 2, 1):
            if len(generated) >= count:
                tail = self.tokenizer.decode(generated[-count:], skip_special_tokens=False)
                if tail.strip() and closing.startswith(tail):
                    return closing[len(tail):]
        return closing

    def between_turns(self, conversation: list[dict[str, str]], generated: list[int],
                      observation: dict[str, str]) -> list[int]:
        """Tokens to append after the model's turn (``conversation[-1]``, whose tokens are ``generated``):
        the rest of the assistant message, the ``observation`` message and the next assistant header."""
        closing = self.assistant_closing(conversation[:-1])
        before = self.render(conversation)
        after = self.render([*conversation, observation], add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateNotAppendOnlyError(
                "the chat template is not append-only: rendering the conversation with one more message "
                "changes the text of earlier turns, so observations cannot be appended as tokens. Use a "
                "template that renders turns independently (e.g. without stripping earlier reasoning)."
            )
        if not before.endswith(closing):
            raise TemplateNotAppendOnlyError("the chat template renders the assistant turn's ending differently "
                                             "depending on its content; cannot find the end of the model's turn")
        return self.encode(self.missing_closing(closing, generated) + after[len(before):])
