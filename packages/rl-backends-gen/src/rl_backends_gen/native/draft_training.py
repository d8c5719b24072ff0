"""The online draft: distil the speculative draft from the policy the engine holds, on rollouts.

``generation.speculative.train_draft``. After a refit the engine holds the new policy; the training loop
(GRPO, on-policy distillation) then hands this step's rollouts and the library's distillation loss
(``rl_algorithms.losses.DistillationKLLoss``: this package must not import rl-algorithms, so the caller
passes it in) to ``DraftTrainer.train``::

    teacher = top-k of the policy's logits at the generated tokens   # the engine's model, no gradients
    for each of draft_steps passes:
        student = the draft's logits at the same tokens              # the draft's own decoder and head
        loss(student, teacher) -> backward -> AdamW on the draft's own parameters

The decoders run over whole sequences (the generated tokens attend to their prompts); the LM head and the
softmaxes only at the generated tokens (``loss_mask``), which the loss sees as one row of N positions.

The draft's forward runs whole right-padded sequences through a ``SequenceStep`` (causal, no cache). The
policy's runs each prompt once for the rows that share it (a prompt's n samples): prefilled into the engine's
cache rows, the rows' tokens continuing from it, as generation does; between generate calls those rows
hold nothing a later call reads (each call prefills its own). Without an allocated cache (asleep) it runs
whole rows through a ``SequenceStep`` too. What the draft owns and trains: a ``policy_layers:N``
draft its copies of the first N layers and the final norm (``proposers.policy_layers_decoder(own=True)``);
it shares the embeddings and the head with the policy (frozen here, refitted with the policy). A draft
loaded from a path owns all its parameters. A refit never writes what the draft owns.

What the draft learned outlives the engine two ways: ``state_dict`` / ``load_state_dict`` (its own parameters
by name and AdamW's state: a training checkpoint keeps them, so a resumed run goes on with the same draft),
and ``save_hf`` (the draft as an HF causal LM directory, embeddings and head included, that
``generation.speculative.draft_model`` or vLLM's draft model takes).
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path

import torch

from rl_backends_gen.native.cache import AttentionKV
from rl_backends_gen.native.proposers import DraftProposer
from rl_backends_gen.native.steps import PrefillStep, SequenceStep
from rl_core.types import ModelOutputs, Normalizer

MAX_GRAD_NORM = 1.0


class DraftTrainer:
    """An AdamW optimizer over the draft's own parameters and the distillation step of one training step."""

    def __init__(self, engine, proposer: DraftProposer, lr: float, steps: int, top_k: int):
        refuse_untrainable(engine.cache.layers, "the policy")
        refuse_untrainable(proposer.cache.layers, "the draft")
        if engine.fp8_layers:
            raise ValueError("generation.speculative.train_draft trains the draft's layers in generation.dtype; "
                             "this engine holds them in fp8: remove quantization or set train_draft: false")
        if why := top_k_refusal(top_k, engine.head.weight.shape[0]):
            raise ValueError(f"generation.speculative.draft_top_k {why}")
        self.engine, self.proposer = engine, proposer
        self.steps, self.top_k = steps, top_k
        self.named = owned_parameters(engine, proposer)
        self.parameters = list(self.named.values())
        if not self.parameters:
            raise ValueError("generation.speculative.train_draft: the draft shares every parameter with the policy, "
                             "so it has nothing of its own to train")
        for param in self.parameters:
            param.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.parameters, lr=lr, weight_decay=0.0)

    def train(self, batch, loss_fn) -> dict[str, float]:
        """``draft_steps`` optimizer steps of the draft towards the engine's policy on ``batch`` (right-padded
        ``input_ids`` / ``attention_mask`` / ``loss_mask`` [B, T]; the loss sees the ``loss_mask`` tokens).
        ``loss_fn(outputs, batch, normalizer) -> (loss, metrics)`` reads ``outputs.logits`` and the batch's
        ``teacher_topk_logits`` / ``teacher_topk_indices``; it is handed the scored positions only, as one
        row (``[1, N, ...]``, all in ``loss_mask``): the LM head and the softmaxes run on the generated tokens,
        not on the prompts. Returns the loss of the first pass (how far the draft was from the policy) and of
        the last, the tokens and the seconds spent."""
        start = time.perf_counter()
        engine = self.engine
        input_ids = batch["input_ids"].to(engine.device)
        scored = batch["loss_mask"].to(engine.device).bool()
        scored[:, 0] = False  # no distribution scores the first token
        with torch.no_grad():
            teacher = self._policy_hidden(input_ids, scored)
            top = engine.head(teacher).float().topk(self.top_k)  # [N, k]: the N scored tokens, row-major
        chunks = torch.arange(input_ids.shape[0]).split(max(1, engine.max_prefill_tokens // input_ids.shape[1]))
        ends = scored.sum(dim=1).cumsum(0).tolist()
        parts = []
        for rows in chunks:
            where = scored[rows].nonzero(as_tuple=True)
            first, last = (ends[rows[0] - 1] if rows[0] else 0), ends[rows[-1]]
            parts.append({"ids": input_ids[rows], "before": (where[0], where[1] - 1), "targets": input_ids[rows][where],
                          "teacher_topk_logits": top.values[None, first:last],
                          "teacher_topk_indices": top.indices[None, first:last]})
        tokens = float(scored.sum())
        normalizer = Normalizer(num_valid_tokens=max(tokens, 1.0), num_valid_sequences=float(len(scored)))
        losses = []
        for _ in range(self.steps):
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for part in parts:
                if not len(part["targets"]):
                    continue
                hidden = self._hidden(self.proposer.forward, self.proposer.cache, part["ids"])
                logits = self.proposer.head(hidden[part["before"]]).float()[None]  # [1, N, V]
                with torch.no_grad():
                    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, part["targets"][None, :, None])[..., 0]
                sub = {"loss_mask": torch.ones_like(logprobs), "teacher_topk_logits": part["teacher_topk_logits"],
                       "teacher_topk_indices": part["teacher_topk_indices"]}
                loss, _ = loss_fn(ModelOutputs(logprobs=logprobs, logits=logits), sub, normalizer)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(self.parameters, MAX_GRAD_NORM)
            self.optimizer.step()
            losses.append(total)
        return {"distill_loss": losses[0], "distill_loss_last": losses[-1], "tokens": tokens,
                "train_seconds": time.perf_counter() - start}

    def state_dict(self) -> dict:
        """The draft's own parameters (``decoder.<name>`` / ``head.<name>``, on the CPU) and AdamW's state; with a
        draft vocabulary (``draft_vocab_size``) its token counts, so a resumed run picks the same tokens."""
        state = {"parameters": {name: param.detach().to("cpu", copy=True) for name, param in self.named.items()},
                 "optimizer": self.optimizer.state_dict()}
        if self.proposer.vocab is not None:
            state["vocab_counts"] = self.proposer.vocab.counts.clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s output; ValueError (nothing changed) when it is another draft's."""
        saved = state["parameters"]
        if list(saved) != list(self.named):
            names = sorted(set(saved) ^ set(self.named))
            raise ValueError(f"the saved draft has other parameters than this config's draft ({names[:3]} ...): "
                             "set generation.speculative.draft_model as when it was saved")
        for name, param in self.named.items():
            if saved[name].shape != param.shape:
                raise ValueError(f"the saved draft's {name} is {tuple(saved[name].shape)}, this draft's "
                                 f"{tuple(param.shape)}: set generation.speculative.draft_model as when it was saved")
        counts, vocab = state.get("vocab_counts"), self.proposer.vocab
        if vocab is not None and counts is not None and counts.shape != vocab.counts.shape:
            raise ValueError(f"the saved draft vocabulary counts {counts.shape[0]} tokens, this policy's vocabulary "
                             f"{vocab.counts.shape[0]}: resume with the tokenizer the run was saved with")
        with torch.no_grad():
            for name, param in self.named.items():
                param.copy_(saved[name])
        self.optimizer.load_state_dict(state["optimizer"])
        if vocab is not None and counts is not None:  # saved without a draft vocabulary: it counts from here
            vocab.counts.copy_(counts)

    def save_hf(self, path: str | Path) -> Path:
        """The draft as an HF causal LM directory at ``path`` (written beside it, then renamed into place):
        its layers and final norm, and the embeddings and head it shares with the policy, with the engine's
        tokenizer. ``from_pretrained`` loads it; ``generation.speculative.draft_model`` takes the path."""
        from transformers import AutoModelForCausalLM

        path = Path(path)
        decoder, head = self.proposer.decoder, self.proposer.head
        config = copy.deepcopy(decoder.config)
        config.architectures = None
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        prefix = {"decoder": child_name(model, model.get_decoder()), "head": child_name(model, model.get_output_embeddings())}
        tensors = {f"{prefix['decoder']}.{name}": value for name, value in decoder.state_dict().items()}
        tensors.update({f"{prefix['head']}.{name}": value for name, value in head.state_dict().items()})
        # clones: the engine's weights may be views of its packed q/k/v tensors, and safetensors stores each once
        tensors = {name: value.detach().to("cpu", copy=True) for name, value in tensors.items()}
        tied = bool(getattr(config, "tie_word_embeddings", False))
        missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
        missing = [name for name in missing if not (tied and name.startswith(f"{prefix['head']}."))]
        if missing or unexpected:
            raise RuntimeError(f"the draft does not fit {type(model).__name__}: missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}")
        if tied:
            model.tie_weights()
        staging = path.with_name(f".{path.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, safe_serialization=True)
        if self.engine.tokenizer is not None:
            self.engine.tokenizer.save_pretrained(staging)
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
        return path

    def _policy_hidden(self, input_ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]``: the policy's final hidden state before each of the N ``scored`` tokens (row-major),
        the one that scores it. A row's prompt (its tokens before its first scored one) goes through the
        model once for every row that shares it (a prompt's n samples), as generation prefills it: into the
        engine's cache, then each row's continuation after it. Without an allocated cache, or with a row
        longer than the cache, every row runs whole (``SequenceStep``)."""
        engine, cache = self.engine, self.engine.cache
        where = scored.nonzero(as_tuple=True)
        if not len(where[0]):
            return torch.zeros(0, engine.head.weight.shape[1], dtype=engine.dtype, device=engine.device)
        firsts = scored.int().argmax(dim=1)  # each row's first scored column
        lasts = scored.shape[1] - 1 - scored.flip(1).int().argmax(dim=1)
        if not cache.allocated or int(lasts.max()) > cache.max_seq_len:
            return self._hidden(engine._forward, cache, input_ids)[where[0], where[1] - 1]
        groups: dict[tuple[int, ...], list[int]] = {}
        for row in scored.any(dim=1).nonzero()[:, 0].tolist():
            groups.setdefault(tuple(input_ids[row, : int(firsts[row])].tolist()), []).append(row)
        hidden = torch.zeros(*input_ids.shape, engine.head.weight.shape[1], dtype=engine.dtype, device=engine.device)
        for prompt, members in groups.items():
            for rows in torch.tensor(members).split(engine.max_batch_size):
                part = self._prompt_then_rows(prompt, input_ids[rows], lasts[rows])
                hidden[rows, : part.shape[1]] = part
        return hidden[where[0], where[1] - 1]

    def _prompt_then_rows(self, prompt: tuple[int, ...], input_ids: torch.Tensor, lasts: torch.Tensor) -> torch.Tensor:
        """``[R, len(prompt) + width, hidden]``: ``prompt`` prefilled once into cache rows ``0 .. R-1``, then the
        rows' tokens after it up to their last scored one (``lasts``) continuing from the cache."""
        engine, device = self.engine, self.engine.device
        count, start = len(input_ids), len(prompt)
        slots = torch.arange(count, device=device)
        step = PrefillStep(engine.cache, slots, torch.zeros_like(slots), torch.tensor([start], device=device), start)
        prefix = engine._forward(torch.tensor([prompt], device=device), torch.arange(start, device=device)[None], step)
        out = prefix.expand(count, -1, -1)
        width = int(lasts.max()) - start
        if width > 0:
            positions = torch.arange(start, start + width, device=device).expand(count, width)
            step = PrefillStep(engine.cache, slots, slots, lasts - start, width, start, slots)
            rest = engine._forward(input_ids[:, start : start + width], positions, step)
            out = torch.cat([out, rest], dim=1)
        return out

    @staticmethod
    def _hidden(forward, cache, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, T, hidden]`` final hidden states of ``input_ids`` (whole sequences, causal, no cache)."""
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        return forward(input_ids, positions, SequenceStep(cache, length, input_ids.device))


def top_k_refusal(top_k: int, vocab: int) -> str | None:
    """Why the draft cannot be distilled on the policy's ``top_k`` most likely tokens of ``vocab``, or None."""
    return None if top_k <= vocab else f"{top_k}: the policy's vocabulary has {vocab} tokens; set draft_top_k <= {vocab}"


def refuse_untrainable(layers, what: str) -> None:
    """NotImplementedError unless every layer cache of ``layers`` is softmax attention (what draft training runs)."""
    for index, layer in enumerate(layers):
        if not isinstance(layer, AttentionKV):
            raise NotImplementedError(
                f"generation.speculative.train_draft: {what}'s layer {index} is not softmax attention "
                f"({type(layer).__name__}); online draft training runs full / sliding-window attention "
                "models only: set train_draft: false")


def owned_parameters(engine, proposer: DraftProposer) -> dict[str, torch.nn.Parameter]:
    """The draft's parameters that are not the policy's (each once), by ``decoder.<name>`` / ``head.<name>``."""
    policy = {id(param) for param in engine.model.parameters()}
    seen: dict[int, tuple[str, torch.nn.Parameter]] = {}
    for prefix, module in (("decoder", proposer.decoder), ("head", proposer.head)):
        for name, param in module.named_parameters():
            if id(param) not in policy:
                seen.setdefault(id(param), (f"{prefix}.{name}", param))
    return dict(seen.values())


def child_name(model: torch.nn.Module, child: torch.nn.Module) -> str:
    """The attribute of ``model`` holding ``child`` (a causal LM's decoder or head)."""
    return next(name for name, module in model.named_children() if module is child)
