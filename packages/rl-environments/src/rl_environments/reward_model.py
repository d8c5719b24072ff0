"""Reward model: scores whole conversations with an HF sequence-classification model (one label), as
exported by ``rl rm``. Loaded lazily, once per process (so the environment pickles as a path)."""

from __future__ import annotations

import os
from typing import Any

from rl_core.types import StepResult


class RewardModelEnvironment:
    """Single-turn: reward = the model's score of the conversation (component ``score``).

    ``step_batch`` scores many conversations in batches of ``batch_size`` (the rollout engine uses it
    when available)."""

    def __init__(self, model_dir: str, batch_size: int = 8, max_length: int = 2048, device: str = "cpu",
                 dtype: str = "float32"):
        if not os.path.isdir(model_dir):
            raise FileNotFoundError(f"reward model directory {model_dir!r} does not exist (train one with `rl rm`)")
        self.model_dir = model_dir
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.dtype = dtype
        self._loaded: tuple[int, Any, Any] | None = None  # (pid, model, tokenizer)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_loaded"] = None
        return state

    def _model(self):
        if self._loaded is None or self._loaded[0] != os.getpid():
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            model = AutoModelForSequenceClassification.from_pretrained(
                self.model_dir, dtype=getattr(torch, self.dtype)).to(self.device).eval()
            if model.config.num_labels != 1:
                raise ValueError(f"{self.model_dir}: a reward model needs num_labels=1, got {model.config.num_labels}")
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tokenizer.pad_token_id
            self._loaded = (os.getpid(), model, tokenizer)
        return self._loaded[1], self._loaded[2]

    def score(self, conversations: list[list[dict[str, str]]]) -> list[float]:
        """One scalar per conversation (read at its last token)."""
        import torch

        model, tokenizer = self._model()
        texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                            truncation=True, max_length=self.max_length, add_special_tokens=False)
            with torch.no_grad():
                logits = model(**{k: v.to(self.device) for k, v in enc.items()}).logits  # [b, 1]
            scores += logits[:, 0].float().tolist()
        return scores

    def step_batch(self, items: list[tuple[list[dict[str, str]], dict, dict | None]]) -> list[StepResult]:
        scores = self.score([messages for messages, _, _ in items])
        return [StepResult(reward=s, reward_components={"score": s}, done=True) for s in scores]

    def step(self, messages, metadata, state) -> StepResult:
        return self.step_batch([(messages, metadata, state)])[0]
