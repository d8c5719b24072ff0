"""Proposers of speculative decoding: n-gram prompt lookup and a draft model.

A proposer gives, for each active row of a generate call, up to ``k`` guessed next tokens
(``Proposals``); the engine verifies them (``verify.py``). The draft model keeps a cache of its own
whose rows mirror the target's (same slots, moved together when rows finish); entries past a row's
accepted length are simply overwritten by the next step (rollback is the length).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rl_backends_gen.native.attention import ATTENTION_NAME
from rl_backends_gen.native.cache import EngineCache, RecurrentState
from rl_backends_gen.native.draft_vocab import DraftVocabulary
from rl_backends_gen.native.layers import build_layer_caches
from rl_backends_gen.native.sampling import sample_tokens
from rl_backends_gen.native.steps import DecodeStep, PrefillStep

# Config keys holding one entry per decoder layer: truncated with the layers for a policy_layers draft.
PER_LAYER_KEYS = ("layer_types", "mlp_layer_types", "layers_block_type")


@dataclass
class Proposals:
    tokens: torch.Tensor  # [R, k] long; row r's first counts[r] are real
    counts: torch.Tensor  # [R] long


class NgramIndex:
    """One row's tokens (prompt + completion) and, per n-gram, the end of its latest occurrence that
    has a successor: a lookup per step, O(new tokens x n) upkeep."""

    def __init__(self, prompt: list[int], min_n: int, max_n: int):
        self.sizes = range(max_n, min_n - 1, -1)  # longest suffix first
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}
        self.generated = 0  # completion tokens seen so far
        self.extend(prompt)

    def extend(self, new_tokens: list[int]) -> None:
        tokens = self.tokens
        for token in new_tokens:
            end = len(tokens) - 1  # the n-grams ending here now have a successor
            tokens.append(token)
            for n in self.sizes:
                if end - n + 1 >= 0:
                    self.ends[tuple(tokens[end - n + 1 : end + 1])] = end

    def propose(self, k: int) -> list[int]:
        tokens = self.tokens
        for n in self.sizes:
            if len(tokens) >= n:
                end = self.ends.get(tuple(tokens[-n:]))
                if end is not None:
                    return tokens[end + 1 : end + 1 + k]
        return []


class NgramProposer:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the row's last n tokens
    (n from ``max_n`` down to ``min_n``)."""

    caches: list[EngineCache] = []

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def start_call(self, call) -> None:
        self.indices: dict[tuple[int, int], NgramIndex] = {}

    def end_call(self, call, results) -> None:
        """Nothing to keep: the next call builds its rows' indices anew."""

    def prefill(self, call, prompt_indices: list[int], slots_of_prompt: dict[int, list[int]]) -> None:
        """Nothing to compute: a row's index is built on its first proposal."""

    def observe(self, call) -> None:
        """Nothing to do on a plain step: the index reads the rows' tokens when it next proposes."""

    def propose(self, call, k: int) -> Proposals:
        rows = call.rows
        count = rows.count
        generated = rows.num_generated[:count].tolist()
        proposals = []
        for slot in range(count):
            info = rows.info[slot]
            key = (info.prompt_index, info.sample_index)
            index = self.indices.get(key)
            if index is None:
                index = self.indices[key] = NgramIndex(info.prompt, self.min_n, self.max_n)
            if index.generated < generated[slot]:
                index.extend(rows.tokens[slot, index.generated : generated[slot]].tolist())
                index.generated = generated[slot]
            proposals.append(index.propose(k))
        tokens = torch.zeros(count, k, dtype=torch.long)
        for slot, proposal in enumerate(proposals):
            tokens[slot, : len(proposal)] = torch.tensor(proposal, dtype=torch.long)
        counts = torch.tensor([len(p) for p in proposals], dtype=torch.long)
        return Proposals(tokens.to(rows.position.device), counts.to(rows.position.device))


class DraftProposer:
    """A small causal LM proposes ``k`` tokens per row, with ``k`` forwards of its own.

    Its j-th proposal is the plain sampler's draw from the draft's logits with the row's own uniform of
    the token index the proposal stands for (greedy: the draft's argmax): the uniform the verifier draws
    the target's token with at that index (``verify.py``). So where the draft's distribution is the
    target's the two draws agree (acceptance ~ the overlap of the two inverse CDFs, close to
    sum min(p, q), where an argmax proposal is accepted with p(argmax q) only), while the output still
    never depends on what was proposed, and no [k, R, V] draft distributions are kept.

    ``target_cache``: the draft's layers are the engine's own first layers (``policy_layers:N``), so
    their keys/values are the target's: the draft reads and writes the engine's cache (the target's
    verify forward rewrites every position the draft wrote, with the same layers), needs no prefill and
    no cache of its own. Otherwise the draft keeps its own cache, whose rows mirror the target's.

    ``vocab`` (``draft_vocab_size``): the draft scores only that vocabulary's tokens (``draft_vocab.py``).
    """

    def __init__(self, decoder: nn.Module, head: nn.Module, cache: EngineCache, target_cache: EngineCache | None = None,
                 vocab: DraftVocabulary | None = None):
        self.decoder, self.head, self.vocab = decoder, head, vocab
        self.shared = target_cache is not None
        if self.shared:
            cache.free()
            cache = target_cache
        self.cache = cache
        self.caches = [] if self.shared else [cache]  # the caches that move with the rows and sleep
        self._work: torch.Tensor | None = None  # the sampler's [rows, V] buffer, freed with the caches

    def start_call(self, call) -> None:
        """A draft vocabulary counts the call's prompts and picks its tokens (reading the head as refitted)."""
        if self.vocab is not None:
            self.vocab.count(call.prompts)
            self.vocab.refresh()

    def end_call(self, call, results) -> None:
        """A draft vocabulary records how many completion tokens it held (``call.stats``), then counts them."""
        if self.vocab is None:
            return
        completions = [completion.token_ids for samples in results for completion in samples]
        covered, total = self.vocab.covered(completions)
        call.stats.vocab_covered += covered
        call.stats.vocab_tokens += total
        self.vocab.count(completions)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, step) -> torch.Tensor:
        """Final hidden states ``[B, L, hidden]`` of the draft, attention routed through ``step``."""
        out = self.decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, rl_step=step)
        return out.last_hidden_state

    def prefill(self, call, prompt_indices: list[int], slots_of_prompt: dict[int, list[int]]) -> None:
        """Run the admitted prompts through the draft into its rows (right-padded, plain causal)."""
        if self.shared:  # the target's prefill wrote these layers
            return
        device = call.device
        prompts = [call.prompts[i] for i in prompt_indices]
        width = max(len(p) for p in prompts)
        input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, : len(prompt)] = torch.tensor(prompt)
        slots = [slot for i in prompt_indices for slot in slots_of_prompt[i]]
        row_of_slot = [row for row, i in enumerate(prompt_indices) for _ in slots_of_prompt[i]]
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        step = PrefillStep(self.cache, torch.tensor(slots, device=device), torch.tensor(row_of_slot, device=device),
                           lengths, width)
        positions = torch.arange(width, device=device).expand(len(prompts), width)
        self.forward(input_ids.to(device), positions, step)

    def observe(self, call) -> None:
        """A plain step (no proposals) is about to run: an own cache takes the rows' last tokens, so it
        holds every position when speculation resumes."""
        if self.shared:
            return
        rows = call.rows
        position = rows.position[: rows.count, None]
        self.forward(rows.last_token[: rows.count, None], position, DecodeStep(self.cache, position))

    def propose(self, call, k: int) -> Proposals:
        """``k`` tokens per row. An own cache's first forward also (re)writes the token before the row's
        last one: after a step that accepted every proposal, the draft never saw the last of them."""
        rows = call.rows
        count = rows.count
        position, generated = rows.position[:count], rows.num_generated[:count]
        if self.shared:
            input_ids, positions = rows.last_token[:count, None], position[:, None]
        else:
            arange = torch.arange(count, device=position.device)
            before_last = torch.where(generated >= 2, rows.tokens[arange, (generated - 2).clamp(min=0)],
                                      rows.prompt_last[:count])
            input_ids = torch.stack([before_last, rows.last_token[:count]], dim=1)  # [R, 2]
            positions = torch.stack([position - 1, position], dim=1)
        tokens = torch.zeros(count, k, dtype=torch.long, device=position.device)
        uniforms = proposal_uniforms(rows, k)
        for j in range(k):
            hidden = self.forward(input_ids, positions, DecodeStep(self.cache, positions))
            last = hidden[:, -1]
            logits = (self.head(last) if self.vocab is None else self.vocab.logits(last)).float()
            token, _ = sample_tokens(logits, call.sampling, uniforms[:, j], self._work_buffer(logits))  # [R]
            if self.vocab is not None:
                token = self.vocab.ids[token]  # its index in the draft vocabulary -> its token id
            tokens[:, j] = token
            input_ids, positions = token[:, None], (position + j + 1)[:, None]
        return Proposals(tokens, torch.full((count,), k, dtype=torch.long, device=position.device))

    def _work_buffer(self, logits: torch.Tensor) -> torch.Tensor:
        """A float32 [rows, V] buffer for the sampler, reused while large enough."""
        work = self._work
        if work is None or work.shape[0] < logits.shape[0] or work.shape[1] != logits.shape[1] \
                or work.device != logits.device:
            work = self._work = torch.empty_like(logits)
        return work


def proposal_uniforms(rows, k: int) -> torch.Tensor:
    """[R, k]: each active row's uniforms of its next ``k`` token indices (clamped at the last one)."""
    count = rows.count
    index = (rows.num_generated[:count, None] + torch.arange(k, device=rows.num_generated.device))
    index = index.clamp(max=rows.uniforms.shape[1] - 1)
    return rows.uniforms[torch.arange(count, device=index.device)[:, None], index]


def build_draft(engine, draft_model: str, policy_layers: int | None, trained: bool = False,
                vocab_size: int | None = None) -> DraftProposer:
    """The draft of ``engine``: its own first ``policy_layers`` layers (shared modules; ``trained``: copies of
    the layers and final norm, see ``policy_layers_decoder``), or the HF causal LM at ``draft_model``;
    ``vocab_size``: its head scores that many tokens only (``draft_vocab.py``)."""
    if policy_layers is not None:
        decoder = policy_layers_decoder(engine, policy_layers, own=trained)
        layers = [copy.copy(layer) for layer in engine.cache.layers[:policy_layers]]  # same kinds and shapes
        for layer in layers:
            if layer is not None:
                layer.buffers = {}
        head = engine.head
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(Path(draft_model).expanduser(), dtype=engine.dtype,
                                                     attn_implementation=ATTENTION_NAME, local_files_only=True)
        model = model.to(engine.device).eval().requires_grad_(False)
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        why = vocab_refusal(draft_model, head.weight.shape[0], engine.head.weight.shape[0])
        if why is not None:
            raise ValueError(f"generation.speculative.draft_model {why}")
        layers = build_layer_caches(model, engine.max_batch_size, engine.max_seq_len, engine.dtype, engine.device)
    refuse_recurrent(layers, "the draft model")
    cache = EngineCache(layers, engine.max_batch_size, engine.max_seq_len, engine.dtype)
    # The engine's own layers (not copies): their keys/values are the target's, so the draft shares its cache.
    own_layers = policy_layers is not None and all(a is b for a, b in zip(decoder.layers, engine.decoder.layers))
    vocab = None if vocab_size is None else DraftVocabulary(vocab_size, head, f"the draft ({draft_model})")
    return DraftProposer(decoder, head, cache, engine.cache if own_layers else None, vocab)


def policy_layers_decoder(engine, count: int, own: bool = False) -> nn.Module:
    """A decoder of the engine model's class running the engine's own embeddings, first ``count`` layers
    and final norm: shared modules, so no extra memory, and a refit of the policy updates the draft.

    ``own`` (a draft trained online): the layers and every other child with parameters except the
    embeddings (the final norm) are copies the draft trains; a refit leaves them alone. The embeddings
    (and the head, ``build_draft``) stay shared: frozen in draft training, updated by refit."""
    source = engine.decoder
    why = layers_refusal(count, len(source.layers))
    if why is not None:
        raise ValueError(f"generation.speculative.draft_model {why}")
    config = copy.deepcopy(source.config)
    config.num_hidden_layers = count
    for key in PER_LAYER_KEYS:
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, getattr(config, key)[:count])
    with torch.device("meta"):
        decoder = type(source)(config)
    embeddings = source.get_input_embeddings()
    for name, child in source.named_children():
        if name == "layers":
            child = nn.ModuleList(copy.deepcopy(layer) if own else layer for layer in list(child)[:count])
        elif own and child is not embeddings and any(True for _ in child.parameters()):
            child = copy.deepcopy(child)
        setattr(decoder, name, child)
    leftover = [name for name, t in [*decoder.named_parameters(), *decoder.named_buffers()] if t.is_meta]
    if leftover:
        raise NotImplementedError(f"policy_layers draft: {config.model_type}'s decoder holds {leftover[:3]} "
                                  "outside its child modules; use a draft model path instead")
    return decoder.eval()


def layers_refusal(count: int, total: int, policy: str = "the policy") -> str | None:
    """Why a ``policy_layers:count`` draft cannot be cut from a policy of ``total`` decoder layers, or None."""
    if count < total:
        return None
    return f"policy_layers:{count}: {policy} has only {total} decoder layers; a draft needs fewer"


def vocab_refusal(draft_model: str, draft_vocab: int, policy_vocab: int) -> str | None:
    """Why the draft at ``draft_model`` cannot propose for the policy (another vocabulary), or None."""
    if draft_vocab == policy_vocab:
        return None
    return (f"{draft_model}: its vocabulary has {draft_vocab} tokens, the policy's {policy_vocab}; the draft must "
            "share the policy's tokenizer")


def refuse_recurrent(layers, what: str) -> None:
    for index, layer in enumerate(layers):
        if isinstance(layer, RecurrentState):
            raise NotImplementedError(
                f"speculative decoding: {what}'s layer {index} is a recurrent layer (linear attention / Mamba-2), "
                "whose state cannot roll back rejected tokens; set generation.speculative=null for this model "
                "(or use generation.backend=vllm)")
