"""What a resume (``checkpointing.resume=true``) must match in the run it continues, checked before anything
is loaded or written, each a ConfigError naming the key (one line, exit 2):

* the command: an ``rl sft`` run is continued by ``rl sft`` only (``run.json``'s command line);
* the checkpoint directory: a run whose checkpoints are in another directory than ``checkpointing.dir`` now
  names (its ``config.yaml``'s) is not started over in place of being continued;
* the model: the checkpoint's weights (names and shapes of its ``policy/hf_config`` and of ``model``, both
  built on the meta device);
* the policy: the task and LoRA or not, as the checkpoint's ``policy/meta.json`` records them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rl_backends_train import TrainBackendConfig
from rl_checkpoint.layout import POLICY_DIR
from rl_core.config import ConfigError, ConfigProblem
from rl_core.models.check import meta_model


def check_resume_command(out: Path, command: str) -> None:
    """ConfigError when ``out``'s run was made by another ``rl`` command than ``command`` (a command line)."""
    from rl_apps.run_dir import read_identity

    identity = read_identity(out)
    before, now = _rl_command(identity.command) if identity else None, _rl_command(command)
    if before is not None and now is not None and before != now:
        raise ConfigError(ConfigProblem("command line", "checkpointing.resume",
                                        f"{out} holds an `rl {before}` run, which `rl {now}` cannot continue; "
                                        f"continue it with `rl {before}`, or choose another output_dir"))


def check_resume_dir(out: Path, checkpoint_dir: Path) -> None:
    """ConfigError when ``checkpoint_dir`` holds no checkpoint but the run in ``out`` saved its checkpoints in
    another directory (its config.yaml's ``checkpointing.dir``, else ``out/checkpoints``): resuming would
    start that run over, overwriting its metrics and final model."""
    recorded = _recorded_checkpoint_dir(out)
    if recorded is None or recorded == checkpoint_dir or _has_steps(checkpoint_dir) or not _has_steps(recorded):
        return
    value = "null" if recorded == out / "checkpoints" else str(recorded)
    raise ConfigError(ConfigProblem("config", "checkpointing.dir",
                                    f"{checkpoint_dir} holds no checkpoint, but the run in {out} saved its checkpoints "
                                    f"in {recorded}; resume with checkpointing.dir={value}, or choose another output_dir"))


def check_resume_model(checkpoint: Path, model: str, model_path: str) -> None:
    """ConfigError at ``model`` when ``checkpoint`` was saved from a model of other weights (names or shapes,
    from its ``policy/hf_config`` and ``model_path`` built on the meta device): one line before anything is
    loaded or written, not a load error in a worker."""
    saved = checkpoint / POLICY_DIR / "hf_config"
    if not (saved / "config.json").is_file():
        return
    try:
        have, want = _weight_shapes(saved), _weight_shapes(model_path)
    except Exception:  # a config this transformers cannot build: loading the checkpoint is the check then
        return
    differ = sorted(set(have) ^ set(want)) or sorted(name for name in have if have[name] != want[name])
    if differ:
        raise ConfigError(ConfigProblem(
            "config", "model", f"{model} is not the model of {checkpoint}, which checkpointing.resume=true would "
            f"load ({len(differ)} weights differ in name or shape, e.g. {differ[0]}); resume with the model the "
            "run was started from (model: in its config.yaml), or start a new run in another output_dir"))


def check_resume_policy(checkpoint: Path, policy: TrainBackendConfig) -> None:
    """ConfigError at ``policy.lora`` (or ``policy.task``) when ``checkpoint``'s policy was trained with LoRA and
    ``policy`` has none, or the other way round (or for another task): its optimizer state and weights are
    another model's."""
    try:
        meta = json.loads((checkpoint / POLICY_DIR / "meta.json").read_text())
    except (OSError, ValueError):
        return  # none (another backend's layout) or damaged: the checkpoint's own checks say so
    if not isinstance(meta, dict):
        return
    if meta.get("task", policy.task) != policy.task:
        raise ConfigError(ConfigProblem("config", "policy.task", f"{checkpoint} was saved by a {meta['task']!r} policy, "
                                        f"this run trains {policy.task!r}; resume with the command and settings the run "
                                        "was started with, or choose another output_dir"))
    if "lora" in meta and (meta["lora"] is None) != (policy.lora is None):
        had = "with LoRA" if meta["lora"] is not None else "without LoRA"
        want = "policy.lora as the run had it (its config.yaml)" if meta["lora"] is not None else "policy.lora=null"
        raise ConfigError(ConfigProblem("config", "policy.lora", f"{checkpoint} was trained {had}; resume with "
                                        f"{want}, or start a new run in another output_dir"))


def _rl_command(line: str) -> str | None:
    """``sft`` of ``rl sft ...``; None for a command line that is not the ``rl`` CLI's (a run from Python)."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    return words[1] if len(words) >= 2 and Path(words[0]).name == "rl" else None


def _recorded_checkpoint_dir(out: Path) -> Path | None:
    """Where the run in ``out`` saved its checkpoints, by its config.yaml; None without a readable one."""
    import yaml

    try:
        saved = yaml.safe_load((out / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    section = saved.get("checkpointing") if isinstance(saved, dict) else None
    if not isinstance(section, dict):
        return None
    folder = section.get("dir")
    return Path(folder).absolute() if isinstance(folder, str) and folder else out / "checkpoints"


def _has_steps(folder: Path) -> bool:
    return folder.is_dir() and any(p.name.startswith("step_") for p in folder.iterdir())


def _weight_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """``{weight name: shape}`` of the HF model whose config.json is in ``model_dir`` (built on the meta device)."""
    return {name: tuple(tensor.shape) for name, tensor in meta_model(model_dir).state_dict().items()}
