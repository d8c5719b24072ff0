"""The one setup path of every training command (grpo, sft, dpo, rm, distill, xtoken-distill)::

    start_run(cfg)      seed; the model and its tokenizer                       (nothing written)
    <the command reads and checks its data: a bad file is a DataError, exit 2>  (nothing written)
    open_run(cfg)       the run directory: config.yaml (atomically), synthetic data, Ray from
                        ``cluster:`` when the run uses it, the metrics logger, the checkpointer
    run.backend(...)    training / generation backends, shut down when the run closes
    run.finish(policy)  the final HF export

Everything a run does to its directory happens in :func:`open_run`: checks on the directory (an
existing run, its identity) belong there.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data import DataFileConfig, write_synthetic_dataset
from rl_apps.run_config import RunConfig, SupervisedRunConfig
from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.cluster import init_ray
from rl_core.config import ConfigError, ConfigProblem, dump_config
from rl_core.data_files import Loaded
from rl_core.logging import MetricsLogger
from rl_core.models import resolve_model
from rl_core.seed import set_seed

T = TypeVar("T")


def start_run(cfg: RunConfig) -> tuple[str, Any]:
    """Seed everything; ``(local HF directory, tokenizer)`` of ``cfg.model``."""
    set_seed(cfg.seed)
    return resolve_with_tokenizer(cfg.model)


def resolve_with_tokenizer(model: str) -> tuple[str, Any]:
    """``(local HF directory, its tokenizer)``."""
    from transformers import AutoTokenizer

    model_path = resolve_model(model)
    return model_path, AutoTokenizer.from_pretrained(model_path)


def load_splits(cfg: SupervisedRunConfig, load: Callable[[str], Loaded[T]]) -> tuple[Loaded[T], Loaded[T] | None]:
    """``(train, validation or None)`` of a supervised command, each loaded with ``load(path)``: from
    ``cfg.data``'s files, or from the synthetic set ``cfg.synthetic_data`` describes. What was kept and
    skipped goes to stderr. Raises DataError on a bad file (nothing is written), ConfigError when one step
    needs more items than the training data holds."""
    data: DataFileConfig = cfg.data
    if cfg.synthetic_data is None:
        train, val = _load_pair(data.train_path, data.validation_path, load)
    else:
        with tempfile.TemporaryDirectory(prefix="rl-synthetic-") as folder:  # the run dir gets them in open_run
            train, val = _load_pair(*write_synthetic_dataset(cfg.SYNTHETIC_KIND, cfg.synthetic_data, folder), load)
    if len(train) < cfg.loop.batch_size:
        raise ConfigError(ConfigProblem("config", f"{cfg.LOOP_SECTION}.batch_size",
                                        f"{cfg.loop.batch_size} items per step, but the training data holds only "
                                        f"{len(train)} usable rows; lower it or add data"))
    return train, val


def _load_pair(train_path: str | None, val_path: str | None, load: Callable[[str], Loaded[T]]):
    train = load(train_path)
    val = load(val_path) if val_path else None
    report_loaded(train, val)
    return train, val


def report_loaded(*splits: Loaded | None) -> None:
    """Rows used and bad rows skipped of each loaded split, on stderr."""
    for loaded in splits:
        if loaded is not None:
            print(loaded.report.summary(), file=sys.stderr)


def items(loaded: Loaded[Any] | None) -> list | None:
    """The rows of an optional split."""
    return loaded.items if loaded is not None else None


@dataclass
class Run:
    """An open run: its directory, metrics logger and checkpointer; backends built through it are shut
    down when the run closes (last built, first shut down)."""

    cfg: RunConfig
    out: Path
    logger: MetricsLogger
    checkpointer: CheckpointManager | None
    _stack: ExitStack

    def backend(self, backend_cfg: TrainBackendConfig, model_path: str, name: str = "policy"):
        """A training backend (Ray workers when ``backend_cfg.use_ray``)."""
        return self.closing(build_training_backend(backend_cfg, model_path, seed=self.cfg.seed, name=name))

    def generation(self, generation_cfg: GenerationConfig, model_path: str):
        return self.closing(build_generation_backend(generation_cfg, model_path))

    def closing(self, thing: T) -> T:
        """Shut ``thing`` down when the run closes."""
        self._stack.callback(thing.shutdown)
        return thing

    def finish(self, policy) -> None:
        """The final model as an HF directory (``<out>/hf``) and, under LoRA, the adapter (``<out>/adapter``)."""
        if not self.cfg.export_hf:
            return
        policy.export_hf(str(self.out / "hf"))
        if self.cfg.policy.lora is not None and hasattr(policy, "save_adapter"):
            policy.save_adapter(str(self.out / "adapter"))
        print(f"model saved to {self.out / 'hf'}")


@contextmanager
def open_run(cfg: RunConfig) -> Iterator[Run]:
    """Create the run directory of ``cfg`` and what lives in it for the run (see the module docstring)."""
    out = Path(cfg.output_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "config.yaml", dump_config(cfg))
    cfg.write_run_data(out / "data")
    if cfg.uses_ray():
        init_ray(cfg.cluster)
    checkpointer = None
    if cfg.checkpointing.enabled:
        checkpointer = CheckpointManager(cfg.checkpointing, cfg.checkpointing.dir or out / "checkpoints")
    with ExitStack() as stack:
        logger = MetricsLogger(cfg.logger, out, total_steps=cfg.loop.max_steps, hparams=cfg.model_dump(mode="json"))
        stack.callback(_close_logger, logger)
        yield Run(cfg, out, logger, checkpointer, stack)


def _close_logger(logger: MetricsLogger) -> None:
    plot = logger.close()
    if plot is not None:
        print(f"metrics plot: {plot}")
    print(f"metrics: {logger.jsonl_path}")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def logits_width(model_path: str) -> int:
    """The model's output vocabulary size (may exceed the tokenizer's length)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).vocab_size)


def stop_tokens(tokenizer) -> tuple[int, ...]:
    """The token ids that end a model turn (the tokenizer's EOS)."""
    return tuple(t for t in [tokenizer.eos_token_id] if t is not None)
