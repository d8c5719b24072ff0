"""SGLang backend (``rl-backends-gen[sglang]``, CUDA only), over SGLang's offline ``sglang.Engine``.

Written against the Engine API: ``generate(input_ids=..., sampling_params=..., return_logprob=True)``
(``meta_info["output_token_logprobs"]`` holds ``(logprob, token_id, text)`` per generated token),
``update_weights_from_tensor(named_tensors)``, ``release_memory_occupation()`` /
``resume_memory_occupation()`` and ``shutdown()``.

Not verified on this project's CPU machines (SGLang wheels need CUDA): its tests carry the ``gpu``
marker. Logprob convention: SGLang reports logprobs of the temperature-scaled distribution; compare
with the trainer's logprobs (the GRPO loop logs the mismatch) before relying on them for
importance weights with top-k / top-p.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rl_backends_gen.requests import default_stop_token_ids, validate_prompts, validate_sampling
from rl_core.types import Completion, SamplingParams

INSTALL_HINT = 'Please install "rl-backends-gen[sglang]" to use the SGLang backend (it needs CUDA)'


def _import_sglang():
    try:
        import sglang
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return sglang


class SglangBackend:
    """``GenerationBackend`` over ``sglang.Engine``."""

    def __init__(self, model_path: str, *, dtype: str = "bfloat16", max_batch_size: int = 64,
                 max_seq_len: int | None = None, seed: int | None = None, mem_fraction_static: float = 0.8,
                 tp_size: int = 1, enable_memory_saver: bool = True):
        sglang = _import_sglang()
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.vocab_size = config.vocab_size
        self.max_seq_len = max_seq_len or getattr(config, "max_position_embeddings", None)
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, config)
        self.memory_saver = enable_memory_saver
        self.engine = sglang.Engine(
            model_path=model_path, dtype=dtype, tp_size=tp_size, mem_fraction_static=mem_fraction_static,
            random_seed=seed if seed is not None else 0, context_length=max_seq_len,
            max_running_requests=max_batch_size, enable_memory_saver=enable_memory_saver,
        )

    @classmethod
    def from_config(cls, cfg, model_path: str) -> SglangBackend:
        if cfg.device != "cuda":
            raise ValueError("generation.backend=sglang needs generation.device=cuda (SGLang is CUDA-only)")
        s = cfg.sglang
        return cls(model_path, dtype=cfg.dtype, max_batch_size=cfg.max_batch_size, max_seq_len=cfg.max_seq_len,
                   seed=cfg.seed, mem_fraction_static=s.mem_fraction_static, tp_size=s.tp_size,
                   enable_memory_saver=s.enable_memory_saver)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Completion]]:
        validate_sampling(sampling)
        prompts = validate_prompts(prompts, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        if not prompts:
            return []
        # One request per sample keeps the output order simple; SGLang's radix cache shares the prefix.
        input_ids = [p for p in prompts for _ in range(sampling.n)]
        params = [self._params(sampling, i, j) for i in range(len(prompts)) for j in range(sampling.n)]
        outputs = self.engine.generate(input_ids=input_ids, sampling_params=params, return_logprob=True)
        completions = [self._completion(ids, out) for ids, out in zip(input_ids, outputs)]
        return [completions[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _params(self, sampling: SamplingParams, prompt_index: int, sample_index: int) -> dict:
        params = dict(
            max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1, min_p=sampling.min_p,
            stop_token_ids=list(sampling.stop_token_ids or self.default_stop_token_ids), ignore_eos=True,
            stop=list(sampling.stop_strings) or None, no_stop_trim=True, skip_special_tokens=True,
        )
        if sampling.seed is not None:
            params["sampling_seed"] = (sampling.seed + prompt_index) * 1_000_003 + sample_index
        return params

    def _completion(self, prompt: list[int], output: dict) -> Completion:
        meta = output["meta_info"]
        token_logprobs = meta["output_token_logprobs"]
        token_ids = [int(t) for _, t, *_ in token_logprobs]
        finish = meta.get("finish_reason") or {}
        reason = "length" if (finish.get("type") if isinstance(finish, dict) else finish) == "length" else "stop"
        return Completion(prompt_token_ids=list(prompt), token_ids=token_ids,
                          logprobs=[float(lp) for lp, *_ in token_logprobs], finish_reason=reason,
                          text=self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors
        self.engine.update_weights_from_tensor(named_tensors=list(items), flush_cache=True)

    def sleep(self) -> None:
        if self.memory_saver:
            self.engine.release_memory_occupation()

    def wake(self) -> None:
        if self.memory_saver:
            self.engine.resume_memory_occupation()

    def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
