"""SGLang backend (``rl-backends-gen[sglang]``, CUDA only), over SGLang's offline ``sglang.Engine``.

Written against the Engine API: ``generate(input_ids=..., sampling_params=..., return_logprob=True)``
(``meta_info["output_token_logprobs"]`` holds ``(logprob, token_id, text)`` per generated token),
``update_weights_from_tensor(named_tensors)``, ``release_memory_occupation()`` /
``resume_memory_occupation()`` and ``shutdown()``.

Seeds: SGLang reads a request's ``sampling_seed`` only with ``enable_deterministic_inference`` (then
with the pytorch sampler; its flashinfer sampler asserts that no seed is given). With
``generation.sglang.deterministic_inference`` (default) the engine starts that way and every request
carries the seed of sample j of prompt i; without it no seed is sent and sampling is not repeatable.
Refit: ``update_weights_from_tensor`` returns ``(success, message)``: a failure raises with SGLang's
message. The weights go in buckets of ``generation.refit_bucket_bytes`` (SGLang copies each into
place with the model's ``load_weights``), the cache flushed after the last.

Not verified on this project's CPU machines (SGLang wheels need CUDA): its tests carry the ``gpu``
marker. Logprob convention: SGLang reports logprobs of the temperature-scaled distribution; compare
with the trainer's logprobs (the GRPO loop logs the mismatch) before relying on them for
importance weights with top-k / top-p.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rl_backends_gen.config import GenerationConfig, config_from_settings
from rl_backends_gen.requests import default_stop_token_ids, validate_prompts, validate_sampling
from rl_backends_gen.weights import chunk_named_tensors
from rl_core.types import Completion, SamplingParams

INSTALL_HINT = 'Please install "rl-backends-gen[sglang]" to use the SGLang backend (it needs CUDA)'


def _import_sglang():
    try:
        import sglang
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return sglang


def device_refusal(cfg: GenerationConfig) -> str | None:
    """Why ``cfg`` cannot run SGLang (it is CUDA-only), or None."""
    if cfg.device != "cuda":
        return "generation.backend=sglang needs generation.device=cuda (SGLang is CUDA-only)"
    return None


SEED_MODULUS = 2**63  # SGLang refuses a sampling_seed outside int64


def engine_kwargs(cfg: GenerationConfig, model_path: str) -> dict:
    """Keyword arguments of ``sglang.Engine`` (its ``ServerArgs``) for ``cfg``."""
    s = cfg.sglang
    kwargs = dict(model_path=model_path, dtype=cfg.dtype, tp_size=s.tp_size, mem_fraction_static=s.mem_fraction_static,
                  random_seed=cfg.seed if cfg.seed is not None else 0, context_length=cfg.max_seq_len,
                  max_running_requests=cfg.max_batch_size, enable_memory_saver=s.enable_memory_saver)
    if s.deterministic_inference:
        kwargs.update(enable_deterministic_inference=True, sampling_backend="pytorch")
    return kwargs


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The ``sampling_seed`` of sample ``sample_index`` of prompt ``prompt_index`` (within int64)."""
    return ((seed + prompt_index) * 1_000_003 + sample_index) % SEED_MODULUS


def request_params(sampling: SamplingParams, prompt_index: int, sample_index: int, *,
                   default_stop_token_ids: Sequence[int], seeded: bool) -> dict:
    """SGLang's sampling parameters of one request (sample ``sample_index`` of prompt ``prompt_index``)."""
    params = dict(
        max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1, min_p=sampling.min_p,
        stop_token_ids=list(sampling.stop_token_ids or default_stop_token_ids), ignore_eos=True,
        stop=list(sampling.stop_strings) or None, no_stop_trim=True, skip_special_tokens=True,
    )
    if sampling.seed is not None and seeded:
        params["sampling_seed"] = sample_seed(sampling.seed, prompt_index, sample_index)
    return params


def update_engine_weights(engine, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                          dtype: str) -> int:
    """Send the weights in buckets through ``engine.update_weights_from_tensor``; raise RuntimeError
    with SGLang's message when a bucket is refused. Returns the number of buckets."""
    buckets = chunk_named_tensors(named_tensors, bucket_bytes, dtype=dtype)
    bucket, sent = next(buckets, None), 0
    while bucket is not None:
        following = next(buckets, None)
        success, message = engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=following is None)
        if not success:
            names = f"{bucket[0][0]} .. {bucket[-1][0]}"
            raise RuntimeError(f"SGLang refused the weight update (bucket {sent + 1}: {names}): {message}")
        bucket, sent = following, sent + 1
    return sent


class SglangBackend:
    """``GenerationBackend`` over ``sglang.Engine``."""

    def __init__(self, model_path: str, cfg: GenerationConfig | None = None, **settings):
        """``cfg``, or keyword ``settings``: fields of ``GenerationConfig`` (dtype, max_batch_size,
        max_seq_len, seed, refit_bucket_bytes) and of its ``sglang`` section (mem_fraction_static, ...)."""
        cfg = cfg if cfg is not None else config_from_settings("sglang", {"dtype": "bfloat16", **settings})
        sglang = _import_sglang()
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.vocab_size = config.vocab_size
        self.max_seq_len = cfg.max_seq_len or getattr(config, "max_position_embeddings", None)
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, config)
        self.memory_saver = cfg.sglang.enable_memory_saver
        self.seeded = cfg.sglang.deterministic_inference
        self.dtype = cfg.dtype
        self.refit_bucket_bytes = cfg.refit_bucket_bytes
        self.engine = sglang.Engine(**engine_kwargs(cfg, model_path))

    @classmethod
    def from_config(cls, cfg: GenerationConfig, model_path: str) -> SglangBackend:
        why = device_refusal(cfg)
        if why is not None:
            raise ValueError(why)
        return cls(model_path, cfg)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Completion]]:
        validate_sampling(sampling)
        prompts = validate_prompts(prompts, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len,
                                   backend="sglang")
        if not prompts:
            return []
        # One request per sample keeps the output order simple; SGLang's radix cache shares the prefix.
        input_ids = [p for p in prompts for _ in range(sampling.n)]
        params = [request_params(sampling, i, j, default_stop_token_ids=self.default_stop_token_ids, seeded=self.seeded)
                  for i in range(len(prompts)) for j in range(sampling.n)]
        outputs = self.engine.generate(input_ids=input_ids, sampling_params=params, return_logprob=True)
        completions = [self._completion(ids, out) for ids, out in zip(input_ids, outputs)]
        return [completions[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

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
        update_engine_weights(self.engine, named_tensors, self.refit_bucket_bytes, self.dtype)

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
