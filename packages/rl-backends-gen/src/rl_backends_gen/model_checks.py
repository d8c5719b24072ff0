"""Checks of a generation config against the model it will generate with, made before any engine is built
(and before a run writes anything): what the config schema cannot know without the model's ``config.json``.

``check_draft``: a speculative draft must fit the policy: ``policy_layers:N`` below the policy's layer
count, a draft model from a path with the policy's vocabulary, ``draft_vocab_size`` below that vocabulary.
The engine refuses the same when it builds the draft; found here, the mistake is one line and exit 2
instead of a traceback after the run directory was created.
"""

from __future__ import annotations

from pathlib import Path

from rl_backends_gen.config import GenerationConfig
from rl_core.config import ConfigError, ConfigProblem

KEY = "generation.speculative"


def check_draft(cfg: GenerationConfig, model_path: str) -> None:
    """ConfigError naming each ``generation.speculative`` key that the model at ``model_path`` cannot take."""
    spec = cfg.speculative
    if spec is None or spec.method != "draft":
        return
    from transformers import AutoConfig

    policy = AutoConfig.from_pretrained(model_path).get_text_config()
    vocab = policy.vocab_size
    problems = []
    if spec.policy_layers is not None:
        if spec.policy_layers >= policy.num_hidden_layers:
            problems.append(_problem("draft_model", f"policy_layers:{spec.policy_layers}: the policy ({model_path}) has "
                                     f"only {policy.num_hidden_layers} decoder layers; a draft needs fewer"))
    else:
        draft_vocab, why = _vocab_of(spec.draft_model)
        if why is not None:
            problems.append(_problem("draft_model", why))
        elif draft_vocab != vocab:
            problems.append(_problem("draft_model", f"{spec.draft_model}: its vocabulary has {draft_vocab} tokens, the "
                                     f"policy's {vocab}; the draft must share the policy's tokenizer"))
    if spec.draft_vocab_size is not None and spec.draft_vocab_size >= vocab:
        problems.append(_problem("draft_vocab_size", f"{spec.draft_vocab_size}: the policy's vocabulary has only {vocab} "
                                 "tokens; set it below that, or remove it to score the whole vocabulary"))
    if problems:
        raise ConfigError(problems)


def _vocab_of(draft_model: str) -> tuple[int | None, str | None]:
    """``(vocabulary size, None)`` of the draft at ``draft_model``, or ``(None, why it cannot be read)``."""
    from transformers import AutoConfig

    path = Path(draft_model).expanduser()
    if not path.exists() and (path.is_absolute() or draft_model.startswith((".", "~"))):
        return None, f"{draft_model}: no such directory; give an HF causal LM's directory, or policy_layers:N"
    if path.exists() and not (path / "config.json").is_file():
        return None, (f"{draft_model}: not an HF model directory (no config.json); give an HF causal LM with the "
                      "policy's tokenizer, or policy_layers:N")
    try:
        return AutoConfig.from_pretrained(path if path.exists() else draft_model).get_text_config().vocab_size, None
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"{draft_model}: cannot read its config ({first}); give an HF model directory or policy_layers:N"


def _problem(key: str, message: str) -> ConfigProblem:
    return ConfigProblem("config", f"{KEY}.{key}", message)
