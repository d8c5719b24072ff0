"""Text a person reads to check a run before it starts (``--dry-run``): the model, the data, one sample
as the model will see it with the tokens that carry loss marked."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rl_core.data_files import Loaded

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
"""Marks around the tokens that carry loss in a rendered sample."""
RULE = "-" * 72


def out(line: str = "") -> None:
    print(line, file=sys.stdout)


def describe_model(label: str, name: str, path: str, tokenizer) -> None:
    """``model <name> -> <dir> (<type>, N parameters, vocab V)`` and what the tokenizer brings."""
    out(f"{label:<10}{name} -> {path} ({_architecture(path)})")
    template = "yes" if getattr(tokenizer, "chat_template", None) else "no (plain text only)"
    out(f"{'':<10}tokenizer: {len(tokenizer)} tokens, chat template: {template}, eos {tokenizer.eos_token!r}, "
        f"pad {tokenizer.pad_token!r}")


def _architecture(path: str) -> str:
    """Model type, parameter count (the model built on the meta device: no weights are read) and vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    return f"{config.model_type}, {parameters / 1e6:.2f}M parameters, vocab {config.vocab_size}"


def describe_splits(train: Loaded, val: Loaded | None, synthetic: bool) -> None:
    """Rows used and skipped of each split."""
    where = "synthetic (a real run writes it to <output_dir>/data)" if synthetic else train.report.path
    out(f"{'data':<10}train: {_rows(train)} from {where}")
    if val is not None:
        out(f"{'':<10}validation: {_rows(val)}" + ("" if synthetic else f" from {val.report.path}"))
    else:
        out(f"{'':<10}validation: none")


def _rows(loaded: Loaded) -> str:
    skipped = f", {loaded.report.num_skipped} bad rows skipped" if loaded.report.num_skipped else ""
    return f"{len(loaded)} rows{skipped}"


def masked_text(tokenizer, input_ids: Sequence[int], loss_mask: Sequence[float]) -> str:
    """The decoded tokens, with each run of tokens that carry loss between ⟦ and ⟧."""
    pieces, run, trained = [], [], None
    for token, mask in zip(input_ids, loss_mask):
        if bool(mask) != trained and run:
            pieces.append(_piece(tokenizer, run, trained))
            run = []
        trained = bool(mask)
        run.append(token)
    if run:
        pieces.append(_piece(tokenizer, run, trained))
    return "".join(pieces)


def _piece(tokenizer, ids: list[int], trained: bool | None) -> str:
    text = tokenizer.decode(ids)
    return f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}" if trained else text


def show_sample(title: str, tokenizer, input_ids: Sequence[int], loss_mask: Sequence[float] | None = None) -> None:
    """A tokenised sample between rules, with its token counts (and loss mask when it has one)."""
    counts = f"{len(input_ids)} tokens"
    if loss_mask is not None:
        counts += f", {int(sum(1 for m in loss_mask if m))} carry loss (between {TRAINED_OPEN} {TRAINED_CLOSE})"
    out(f"{title}: {counts}")
    out(RULE)
    text = masked_text(tokenizer, input_ids, loss_mask) if loss_mask is not None else tokenizer.decode(list(input_ids))
    out(text.rstrip("\n"))
    out(RULE)


def show_messages_prompt(title: str, tokenizer, messages: list[dict[str, str]], note: str,
                         metadata: dict[str, Any] | None = None) -> None:
    """A chat prompt rendered with the generation prompt, the text the policy continues."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    show_sample(title, tokenizer, ids)
    if metadata:
        out(f"{'':<10}metadata: {metadata}")
    out(f"{'':<10}{note}")
