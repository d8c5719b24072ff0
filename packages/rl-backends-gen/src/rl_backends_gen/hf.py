"""Reference backend: plain ``transformers`` ``model.generate`` (for parity tests and benchmarks).

Logprobs use the shared convention, computed from the RAW logits that ``generate`` returns
(``output_logits=True``): ``log_softmax(logits / T)`` over the full vocabulary, T = 1 when greedy.
Randomness comes from the global torch generator seeded once per call with ``SamplingParams.seed``,
so sampled tokens are reproducible per call but differ from the native engine's per-sample streams.
Stop strings are applied after generation with the package's rule (stop_strings.py).

A vision-language model (``AutoModelForImageTextToText``) takes prompts with images (``EncodedChat``): each
batch passes its prompts' image tensors (``collate_image_inputs``) and Qwen-VL's ``mm_token_type_ids``
(left-padded like the tokens) to ``generate``, which computes the multimodal positions itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rl_backends_gen.requests import default_stop_token_ids, image_prompts, validate_prompts, validate_sampling
from rl_backends_gen.stop_strings import first_stop_index
from rl_backends_gen.weights import copy_weights_in_place
from rl_core.models.processor import is_vision_language_model
from rl_core.protocols import Prompt
from rl_core.types import Completion, SamplingParams
from rl_core.vision_inputs import EncodedChat, collate_image_inputs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFGenerationBackend:
    """``GenerationBackend`` over ``model.generate`` with left-padded batches of ``batch_size`` prompts."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu", *, batch_size: int = 64,
                 tokenizer=None, attn_implementation: str | None = None):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.device = torch.device(device)
        self.vision = is_vision_language_model(model_path)
        model_class = AutoModelForImageTextToText if self.vision else AutoModelForCausalLM
        self.model = model_class.from_pretrained(
            model_path, dtype=DTYPES[dtype], attn_implementation=attn_implementation
        ).to(self.device).eval().requires_grad_(False)
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_path)
        self.batch_size = batch_size
        config = self.model.config.get_text_config()
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, self.model.config,
                                                             self.model.generation_config)
        self.pad_token_id = next(t for t in (self.tokenizer.pad_token_id, *self.default_stop_token_ids, 0)
                                 if t is not None)
        self.max_seq_len = getattr(config, "max_position_embeddings", None)

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[list[Completion]]:
        validate_sampling(sampling)
        images = image_prompts(prompts)
        if images is not None and not self.vision:
            raise ValueError("a prompt holds images but this backend's model is text-only (no vision_config)")
        prompts = validate_prompts(prompts, vocab_size=self.model.config.get_text_config().vocab_size,
                                   max_seq_len=self.max_seq_len)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        results = []
        with torch.inference_mode():
            for start in range(0, len(prompts), self.batch_size):
                batch_images = None if images is None else images[start : start + self.batch_size]
                results += self._generate_batch(prompts[start : start + self.batch_size], sampling, batch_images)
        return results

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams,
                        images: list[EncodedChat | None] | None) -> list[list[Completion]]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding, as generate expects
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        image_kwargs = {} if images is None or not any(images) else _image_kwargs(images, width)
        stop_ids = list(sampling.stop_token_ids or self.default_stop_token_ids)
        kwargs = dict(do_sample=False) if sampling.greedy else dict(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            min_p=sampling.min_p or None,
        )
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
            max_new_tokens=sampling.max_new_tokens, num_return_sequences=sampling.n, eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id, output_logits=True, return_dict_in_generate=True,
            **{key: value.to(self.device) for key, value in image_kwargs.items()}, **kwargs,
        )
        new_tokens = out.sequences[:, width:].cpu()  # [P * n, T]
        temperature = 1.0 if sampling.greedy else sampling.temperature
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [P * n, T, V], raw
        logprobs = torch.log_softmax(logits / temperature, dim=-1).gather(2, new_tokens[:, :, None]).squeeze(2)
        results = []
        for index, prompt in enumerate(prompts):
            row_results = []
            for sample in range(sampling.n):
                row = index * sampling.n + sample
                row_results.append(self._completion(prompt, new_tokens[row].tolist(), logprobs[row].tolist(),
                                                    stop_ids, sampling))
            results.append(row_results)
        return results

    def _completion(self, prompt, tokens, logprobs, stop_ids, sampling) -> Completion:
        end, reason = len(tokens), "length"
        for position, token in enumerate(tokens):
            if token in stop_ids:
                end, reason = position + 1, "stop"
                break
        if sampling.stop_strings:
            cut = first_stop_index(self.tokenizer, tokens[:end], tuple(sampling.stop_strings))
            if cut is not None:
                end, reason = cut + 1, "stop"
        tokens = tokens[:end]
        return Completion(prompt_token_ids=list(prompt), token_ids=tokens, logprobs=logprobs[:end],
                          finish_reason=reason, text=self.tokenizer.decode(tokens, skip_special_tokens=True))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights_in_place(self.model, named_tensors)

    def sleep(self) -> None:
        """Nothing to free beyond what generate allocates per call (it keeps no cache between calls)."""

    def wake(self) -> None:
        """See ``sleep``."""

    def shutdown(self) -> None:
        self.model = None


def _image_kwargs(images: list[EncodedChat | None], width: int) -> dict[str, torch.Tensor]:
    """``generate``'s image arguments for left-padded prompts: the image tensors in prompt order, and Qwen-VL's
    ``mm_token_type_ids`` [P, width] (0 on padding and text)."""
    kwargs = collate_image_inputs([chat.image_inputs if chat is not None else {} for chat in images])
    if any(chat is not None and chat.mm_token_type_ids is not None for chat in images):
        token_types = torch.zeros(len(images), width, dtype=torch.long)
        for row, chat in enumerate(images):
            if chat is not None and chat.mm_token_type_ids is not None:
                token_types[row, width - len(chat.mm_token_type_ids):] = torch.tensor(chat.mm_token_type_ids)
        kwargs["mm_token_type_ids"] = token_types
    return kwargs
