"""Checks of a generation config against the model it will generate with, made before any engine is built
(and before a run writes anything): what the config schema cannot know without the model.

``check_generation(cfg, model_path, refit)`` raises one ConfigError naming every key the model (and this
installation) cannot take:

* a vision-language model needs a backend that takes prompts with images (``IMAGE_GENERATION_BACKENDS``);
* an engine in this process (``num_replicas: 0``) on ``device: cuda`` needs a CUDA device here;
* the backend must be installed (vLLM, SGLang: their pip extras), SGLang needs ``device: cuda``, and a
  training run's vLLM must be able to take the trainer's weights (``refit``: a mixture-of-experts family
  whose expert names are translated, ``vllm_args.moe_refit_refusal``);
* speculative decoding takes text prompts (not a vision-language model), and its draft must fit the policy:
  ``policy_layers:N`` below the policy's layer count, or a readable model directory here (config and weights;
  nothing is downloaded) with the policy's vocabulary; ``draft_vocab_size`` and ``train_draft``'s
  ``draft_top_k`` within that vocabulary;
* the native engine must run the model's layers (``generation.backend``), speculate on them (no recurrent
  layers: ``generation.speculative``), train a draft on them (softmax attention only:
  ``speculative.train_draft``) and find routers to record (``generation.record_routing``); a draft from a
  path the same (``speculative.draft_model``, ``speculative.train_draft``).

The native checks build the model on the meta device (no weights read, nothing allocated) and ask the
engine's own functions (``build_layer_caches``, ``refuse_recurrent``, ``refuse_untrainable``,
``routers_to_record``), so the messages are the engine's. The engine refuses the same when it is built;
found here, a mistake is one line and exit 2 instead of a traceback after the run directory was created.
"""

from __future__ import annotations

from pathlib import Path

from rl_backends_gen.config import GenerationConfig
from rl_core.config import ConfigError, ConfigProblem
from rl_core.models.check import meta_model

IMAGE_GENERATION_BACKENDS = ("native", "hf")
"""Generation backends that take prompts with images (vLLM, SGLang and Megatron decoding take text only)."""


def check_generation(cfg: GenerationConfig, model_path: str, refit: bool = False) -> None:
    """ConfigError naming each ``generation`` key that the model at ``model_path`` cannot take; ``refit``: the
    caller trains, so the backend will take the trainer's weights."""
    from rl_core.models.processor import is_vision_language_model

    vision = is_vision_language_model(model_path)
    if vision and cfg.backend not in IMAGE_GENERATION_BACKENDS:
        raise ConfigError(_problem("backend", f"{model_path} is a vision-language model; generation.backend="
                                   f"{cfg.backend!r} takes text prompts only: use one of "
                                   f"{list(IMAGE_GENERATION_BACKENDS)} (the native engine runs the vision tower at "
                                   "prefill)"))
    if vision and cfg.speculative is not None:
        raise ConfigError(_problem("speculative", f"{model_path} is a vision-language model; speculative decoding "
                                   "takes text prompts only: set generation.speculative=null"))
    draft = _draft_problems(cfg, model_path)
    problems = _device_problems(cfg) + _backend_problems(cfg, model_path, refit) + draft
    if cfg.backend == "native":
        problems += _native_problems(cfg, model_path, draft_readable=not draft)
    if problems:
        raise ConfigError(problems)


def _device_problems(cfg: GenerationConfig) -> list[ConfigProblem]:
    """An in-process engine (not Ray replicas, which Ray places on GPU nodes; not Megatron's, on the training
    workers) on CUDA needs a CUDA device in this process."""
    import torch

    if cfg.device != "cuda" or cfg.num_replicas > 0 or cfg.backend == "megatron" or torch.cuda.is_available():
        return []
    why = "torch here is built without CUDA" if not torch.backends.cuda.is_built() else "no CUDA device is visible"
    return [_problem("device", f"cuda, but this process has no GPU ({why}; torch {torch.__version__}); set "
                     "generation.device=cpu, run on a GPU machine, or generation.num_replicas >= 1 for engines on "
                     "the cluster's GPU nodes")]


def _backend_problems(cfg: GenerationConfig, model_path: str, refit: bool) -> list[ConfigProblem]:
    """The vLLM / SGLang backend: installed here, on a device it runs on, able to take refitted weights."""
    import importlib.util

    why = None
    if cfg.backend == "vllm":
        from rl_backends_gen.vllm_args import moe_refit_refusal
        from rl_backends_gen.vllm_backend import INSTALL_HINT

        if refit:  # the model first: no installation makes it refittable
            from transformers import AutoConfig

            why = moe_refit_refusal(AutoConfig.from_pretrained(model_path))
        if why is None and importlib.util.find_spec("vllm") is None:
            why = INSTALL_HINT
    elif cfg.backend == "sglang":
        from rl_backends_gen.sglang_backend import INSTALL_HINT, device_refusal

        why = device_refusal(cfg) or (INSTALL_HINT if importlib.util.find_spec("sglang") is None else None)
    return [] if why is None else [_problem("backend", why)]


def _draft_problems(cfg: GenerationConfig, model_path: str) -> list[ConfigProblem]:
    spec = cfg.speculative
    if spec is None or spec.method != "draft":
        return []
    from transformers import AutoConfig

    from rl_backends_gen.native.draft_training import top_k_refusal
    from rl_backends_gen.native.draft_vocab import size_refusal
    from rl_backends_gen.native.proposers import layers_refusal, vocab_refusal

    policy = AutoConfig.from_pretrained(model_path).get_text_config()
    vocab = policy.vocab_size
    if spec.policy_layers is not None:
        why = layers_refusal(spec.policy_layers, policy.num_hidden_layers, f"the policy ({model_path})")
    else:
        draft_vocab, why = _vocab_of(spec.draft_model)
        why = why or vocab_refusal(spec.draft_model, draft_vocab, vocab)
    problems = [] if why is None else [_problem("speculative.draft_model", why)]
    if spec.draft_vocab_size is not None:
        why = size_refusal(spec.draft_vocab_size, vocab, "the policy's")
        problems += [] if why is None else [_problem("speculative.draft_vocab_size", why)]
    if spec.train_draft and (why := top_k_refusal(spec.draft_top_k, vocab)):
        problems.append(_problem("speculative.draft_top_k", why))
    return problems


def _vocab_of(draft_model: str) -> tuple[int | None, str | None]:
    """``(vocabulary size, None)`` of the draft model directory at ``draft_model``, or ``(None, why it cannot be
    used)``. Nothing is downloaded: a name that is not a directory here is refused."""
    from transformers import AutoConfig

    from rl_core.models.check import model_dir_problem

    path = Path(draft_model).expanduser()
    if not path.exists():
        return None, (f"{draft_model}: no such directory (nothing is downloaded); give the directory of an HF causal "
                      "LM with the policy's tokenizer, or policy_layers:N")
    if not (path / "config.json").is_file():
        return None, (f"{draft_model}: not an HF model directory (no config.json); give an HF causal LM with the "
                      "policy's tokenizer, or policy_layers:N")
    if problem := model_dir_problem(path):
        return None, f"{draft_model}: {problem}; re-save the draft model or use policy_layers:N"
    try:
        return AutoConfig.from_pretrained(path).get_text_config().vocab_size, None
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"{draft_model}: cannot read its config ({first}); give an HF model directory or policy_layers:N"


def _native_problems(cfg: GenerationConfig, model_path: str, draft_readable: bool) -> list[ConfigProblem]:
    """What the native engine would refuse when built for ``cfg`` on the model at ``model_path``
    (``draft_readable``: a draft from a path passed ``_draft_problems``, so its layers can be asked too)."""
    import torch

    from rl_backends_gen.native.draft_training import refuse_untrainable
    from rl_backends_gen.native.layers import build_layer_caches
    from rl_backends_gen.native.proposers import refuse_recurrent
    from rl_backends_gen.native.routing import routers_to_record

    model = meta_model(model_path)
    try:
        layers = build_layer_caches(model, 1, 1, torch.float32, torch.device("meta"))
    except NotImplementedError as e:
        return [_problem("backend", f"native: {e}")]
    problems = []
    spec = cfg.speculative
    if spec is not None:  # train_draft's refusal only where speculation itself is possible
        problem = _refusal("speculative", lambda: refuse_recurrent(layers, model.config.get_text_config().model_type))
        if problem is None and spec.train_draft:
            problem = _refusal("speculative.train_draft", lambda: refuse_untrainable(layers, "the policy"))
        if problem is None and spec.method == "draft" and spec.policy_layers is None and draft_readable:
            problem = _path_draft_problem(spec)
        problems += [problem] if problem is not None else []
    if cfg.record_routing:
        problem = _refusal("record_routing", lambda: routers_to_record(model))
        problems += [problem] if problem is not None else []
    return problems


def _path_draft_problem(spec) -> ConfigProblem | None:
    """What the native engine would refuse of the draft model directory ``spec.draft_model`` (which
    ``_draft_problems`` found readable): layers it cannot run, speculate on or (``train_draft``) train."""
    import torch

    from rl_backends_gen.native.draft_training import refuse_untrainable
    from rl_backends_gen.native.layers import build_layer_caches
    from rl_backends_gen.native.proposers import refuse_recurrent

    draft = meta_model(str(Path(spec.draft_model).expanduser()))
    try:
        layers = build_layer_caches(draft, 1, 1, torch.float32, torch.device("meta"))
    except NotImplementedError as e:
        return _problem("speculative.draft_model", f"{spec.draft_model}: the native engine cannot run it ({e})")
    problem = _refusal("speculative.draft_model", lambda: refuse_recurrent(layers, f"the draft model ({spec.draft_model})"))
    if problem is None and spec.train_draft:
        problem = _refusal("speculative.train_draft", lambda: refuse_untrainable(layers, f"the draft ({spec.draft_model})"))
    return problem


def _refusal(key: str, check) -> ConfigProblem | None:
    """The problem at ``generation.<key>`` when ``check()`` refuses, else None."""
    try:
        check()
    except (NotImplementedError, ValueError) as e:
        return _problem(key, str(e))
    return None


def _problem(key: str, message: str) -> ConfigProblem:
    return ConfigProblem("config", f"generation.{key}", message)
