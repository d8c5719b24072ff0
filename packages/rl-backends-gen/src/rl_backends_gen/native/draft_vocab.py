"""The draft's own vocabulary (``generation.speculative.draft_vocab_size``): a draft head over the N tokens
the engine meets most, as EAGLE-3's drafts have.

A draft made of the policy's first layers (``policy_layers:N``) keeps the policy's LM head: on SmolLM2-135M
its 49,152 x 576 weight is twice the size of four decoder layers, so most of a proposal's cost is scoring
tokens a rollout never writes. With a draft vocabulary the draft scores N tokens only: ``ids`` [N] (in
token id order) and their rows of the head's weight (and bias). A proposal is drawn from the draft's
distribution over those N, then mapped to its token id. Verification does not change: the emitted token
is always the target's own draw over the full vocabulary (``verify.py``), so the output does not depend
on the draft vocabulary; a token outside it is simply never proposed (the step rejects there, and the
target draws it as a plain step would).

Which N: the tokens counted most often in the prompts and completions of this engine's generate calls so
far (ties: the lower id; with nothing counted yet the first N ids, which in a BPE vocabulary are its
earliest, most frequent merges). Refreshed at the start of each call, which also re-reads the head's
rows, so a refit of the policy reaches the draft vocabulary too. The counts live with the engine; with
``train_draft`` a training checkpoint keeps them (``DraftTrainer.state_dict``), so a resumed run goes on
with the same tokens; otherwise a new engine counts from its first call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DraftVocabulary:
    """The ``size`` most frequent tokens and the head's rows for them."""

    def __init__(self, size: int, head: nn.Module, what: str):
        vocab = head.weight.shape[0] if isinstance(head, nn.Linear) else None
        if vocab is None:
            raise ValueError(f"generation.speculative.draft_vocab_size: {what}'s LM head is a "
                             f"{type(head).__name__}, not a plain Linear layer; remove draft_vocab_size")
        why = size_refusal(size, vocab, f"{what}'s")
        if why is not None:
            raise ValueError(f"generation.speculative.draft_vocab_size={why}")
        self.size, self.head = size, head
        self.counts = torch.zeros(vocab, dtype=torch.long)  # on the CPU: counted from host token lists
        self.ids = self.weight = self.bias = None
        self.member = torch.zeros(vocab, dtype=torch.bool)  # whether a token id is in ``ids``

    def count(self, sequences) -> None:
        """Add the tokens of ``sequences`` (lists of token ids) to the counts."""
        flat = [token for sequence in sequences for token in sequence]
        if flat:
            self.counts += torch.bincount(torch.tensor(flat, dtype=torch.long), minlength=len(self.counts))

    def refresh(self) -> None:
        """Pick the ``size`` most counted tokens and copy the head's rows for them (the head as it is now)."""
        chosen = torch.argsort(self.counts, descending=True, stable=True)[: self.size]
        ids = chosen.sort().values
        self.member.zero_()
        self.member[ids] = True
        weight = self.head.weight
        self.ids = ids.to(weight.device)
        self.weight = weight.detach()[self.ids]
        self.bias = None if self.head.bias is None else self.head.bias.detach()[self.ids]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, hidden] -> [R, size]``: the head's logits of the vocabulary's tokens."""
        return F.linear(hidden, self.weight, self.bias)

    def covered(self, sequences) -> tuple[int, int]:
        """How many tokens of ``sequences`` are in the vocabulary, of how many."""
        flat = [token for sequence in sequences for token in sequence]
        if not flat:
            return 0, 0
        return int(self.member[torch.tensor(flat, dtype=torch.long)].sum()), len(flat)


def size_refusal(size: int, vocab: int, whose: str) -> str | None:
    """Why a draft vocabulary of ``size`` tokens makes no sense for ``whose`` vocabulary of ``vocab``, or None."""
    if size < vocab:
        return None
    return (f"{size}: {whose} vocabulary has only {vocab} tokens; set it below that, or remove it to score the whole "
            "vocabulary")
