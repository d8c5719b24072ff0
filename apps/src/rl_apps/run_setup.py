"""The one setup path of every training command (grpo, sft, dpo, rm, distill, xtoken-distill)::

    start_run(cfg)      malloc (cluster.malloc); seed; the model and its tokenizer (a name, an HF
                        directory, or a run, checkpoint step or policy/ directory); what the policy's and
                        the generation's backends would refuse for that model, as ConfigErrors
                        (check_lora_targets, check_training, check_generation; resuming: the
                        checkpoint's model and policy, rl_apps.resume_checks)      (nothing written)
    <the command checks lengths against the model's context (check_fits_context) and reads its data:
     a bad file is a DataError, exit 2>                                          (nothing written)
    open_run(cfg)       checks the output directory (a previous run there is refused unless resuming or
                        --overwrite: rl_apps.run_dir) and the cluster; then run.json, config.yaml
                        (atomically), synthetic data, the metrics logger, the checkpointer (with the run id);
                        a resuming run writes run.json, config.yaml and its data only once the loop has
                        loaded the checkpoint (_ResumedRunLogger), so a refused resume changes none of them
    run.backend(...)    training / generation backends, shut down when the run closes
    run.finish(policy, generation)  the final HF export (and the best checkpoint's, and a speculative draft
                        the run trained), "model saved to ..." on stdout

Everything a run does to its directory happens in :func:`open_run`, after every check.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data import DataFileConfig, write_synthetic_dataset
from rl_algorithms.draft import export_draft
from rl_apps.resume_checks import check_resume_command, check_resume_dir, check_resume_model, check_resume_policy
from rl_apps.run_config import RunConfig, SupervisedRunConfig
from rl_apps.run_dir import (
    Invocation,
    RunIdentity,
    check_inputs_survive,
    check_output_dir,
    current_invocation,
    previous_run,
    read_identity,
    refuse_previous_run,
    remove,
    write_atomically,
    write_identity,
)
from rl_backends_gen import GenerationConfig, build_generation_backend, check_generation
from rl_backends_train import TrainBackendConfig, build_training_backend, check_training
from rl_checkpoint import hf_model_dir
from rl_checkpoint.layout import POLICY_DIR
from rl_core.cluster import ClusterConfig, init_ray, malloc
from rl_core.cluster.config import use_placement
from rl_core.config import ConfigError, ConfigProblem, dump_config
from rl_core.data_files import Loaded
from rl_core.logging import MetricsLogger
from rl_core.models import resolve_model
from rl_core.seed import set_seed

T = TypeVar("T")


def start_run(cfg: RunConfig) -> tuple[str, Any]:
    """Check the output directory (as open_run will, so a refusal comes before the model loads; nothing
    is written); seed everything; ``(local HF directory, tokenizer)`` of ``cfg.model``, whose layers
    ``policy.lora.target_modules`` must name (and the generation engine take: ``check_generation``)."""
    _, _, checkpointer, _ = _claim(cfg, Path(cfg.output_dir).absolute(), current_invocation())
    use_process_settings(cfg.cluster)
    set_seed(cfg.seed)
    model_path, tokenizer = resolve_with_tokenizer(cfg.model)
    if checkpointer is not None and cfg.checkpointing.resume and (latest := checkpointer.latest()) is not None:
        check_resume_model(latest, cfg.model, model_path)
        check_resume_policy(latest, cfg.policy)
    check_lora_targets(cfg.policy, model_path)
    check_training(cfg.policy, model_path)  # what the training backend would refuse for this model
    generation = getattr(cfg, "generation", None)
    if isinstance(generation, GenerationConfig):  # what the generation engine would refuse for this model
        check_generation(generation, model_path, refit=True)
    return model_path, tokenizer


def use_process_settings(cluster: ClusterConfig) -> None:
    """``cluster.malloc`` for this process (its workers get it through their environment), and the
    cluster's placement as the default of the worker groups built in-process too."""
    import torch

    use_placement(cluster)
    malloc.apply(cluster.malloc, on_gpu=torch.cuda.is_available())


def resolve_with_tokenizer(model: str) -> tuple[str, Any]:
    """``(local HF directory, its tokenizer)`` of a model name, an HF directory, or a training run,
    checkpoint step or ``policy/`` directory (converted once, next to the checkpoint)."""
    from transformers import AutoTokenizer

    model_path = resolve_model(model, checkpoint_to_hf=hf_model_dir)
    return model_path, AutoTokenizer.from_pretrained(model_path)


def check_lora_targets(backend: TrainBackendConfig, model_path: str) -> None:
    """``lora.target_modules`` against an empty (meta-device) copy of the model: a name matching no layer
    is a ConfigError before anything is written, not in a worker once the run has started. (The DTensor
    backend's ``apply_lora`` raises it; Megatron checks its names in its own config check.)"""
    if backend.lora is None or backend.backend != "dtensor":
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from rl_backends_train.lora import apply_lora

    if backend.task == "reward_model":
        model_class, config = AutoModelForSequenceClassification, AutoConfig.from_pretrained(model_path, num_labels=1)
    else:
        model_class, config = AutoModelForCausalLM, AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        apply_lora(model_class.from_config(config), backend.lora)


def check_fits_context(model_path: str, lengths: dict[str, int | None]) -> None:
    """ConfigError naming each key of ``lengths`` (dotted key -> tokens; None: unset) beyond the model's
    context (``max_position_embeddings``): such sequences run on positions the model never learned, or
    crash in the middle of the run."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path).get_text_config()
    context = getattr(config, "max_position_embeddings", None)
    if not context:
        return
    problems = [ConfigProblem("config", key, f"{value} tokens, beyond the model's context of {context} "
                              f"(max_position_embeddings in {model_path}/config.json); lower it")
                for key, value in lengths.items() if value is not None and value > context]
    if problems:
        raise ConfigError(problems)


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

    def finish(self, policy, generation=None) -> None:
        """The final model as an HF directory, ``<out>/hf`` (under LoRA merged, plus the adapter alone in PEFT
        format in ``<out>/adapter``), with ``generation.speculative.train_draft`` the draft the run trained as
        ``<out>/draft``, and with ``checkpointing.keep_best`` the best checkpoint's model as ``<out>/hf_best``.
        Says where on stdout; without ``export_hf`` the model (and draft) are the last checkpoint's."""
        if not self.cfg.export_hf:
            latest = self.checkpointer.latest() if self.checkpointer is not None else None
            if latest is None:
                print("no model saved (export_hf=false and no checkpoint)")
            else:
                print(f"model saved to {latest / POLICY_DIR} (a training checkpoint: `rl-checkpoint dcp-to-hf` "
                      "converts it, and model= takes it as it is)")
            return
        policy.export_hf(str(self.out / "hf"))
        if self.cfg.policy.lora is not None and hasattr(policy, "save_adapter"):
            policy.save_adapter(str(self.out / "adapter"))
            print(f"LoRA adapter saved to {self.out / 'adapter'}")
        print(f"model saved to {self.out / 'hf'}")
        if export_draft(generation, self.out / "draft") is not None:
            print(f"speculative draft saved to {self.out / 'draft'} (generation.speculative.draft_model takes it)")
        self._export_best(policy)

    def _export_best(self, policy) -> None:
        best = self.checkpointer.best() if self.checkpointer is not None else None
        if best is None:
            return
        path, value = best
        self.checkpointer.load(path, policy)  # the run is over: the policy may hold the best weights now
        policy.export_hf(str(self.out / "hf_best"))
        print(f"best model ({path.name}, {self.cfg.checkpointing.best_metric}={value:.4g}) saved to "
              f"{self.out / 'hf_best'}")


@contextmanager
def open_run(cfg: RunConfig) -> Iterator[Run]:
    """Check and claim the run directory of ``cfg``, then create what lives in it for the run (see the
    module docstring). Every check (a previous run, another run's checkpoints, an unwritable directory,
    a cluster that cannot be joined) comes before anything is written or removed."""
    out = Path(cfg.output_dir).absolute()
    identity, is_new, checkpointer, stale = _claim(cfg, out, current_invocation())
    if cfg.uses_ray():
        start_ray(cfg.cluster)
    remove(stale)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(ConfigProblem("config", "output_dir", f"cannot create {out} ({e.strerror or e}); "
                                        "choose another output_dir")) from None
    written = False

    def write_run_files() -> None:
        nonlocal written
        if not written:
            written = True
            if is_new:
                write_identity(out, identity)
            write_atomically(out / "config.yaml", dump_config(cfg))
            cfg.write_run_data(out / "data")

    resuming = cfg.checkpointing.resume
    if not resuming:
        write_run_files()
    with ExitStack() as stack:
        logger_class = partial(_ResumedRunLogger, on_resumed=write_run_files) if resuming else MetricsLogger
        logger = logger_class(cfg.logger, out, total_steps=cfg.loop.max_steps, hparams=cfg.model_dump(mode="json"))
        stack.callback(_close_logger, logger)
        yield Run(cfg, out, logger, checkpointer, stack)
        write_run_files()  # a run that ended well without resuming through its logger


class _ResumedRunLogger(MetricsLogger):
    """The logger of a resuming run. The loop calls ``resume_from_step`` once the checkpoint has loaded
    (``rl_algorithms.loop.maybe_resume``: policy, data position and speculative draft; -1 when there was
    none), and only then does the run replace its files (``on_resumed``: config.yaml, run.json, synthetic
    data): a refused or crashed resume leaves those of the run it would have continued as they were."""

    def __init__(self, *args, on_resumed: Callable[[], None], **kwargs):
        self._on_resumed = on_resumed
        super().__init__(*args, **kwargs)

    def resume_from_step(self, step: int) -> None:
        super().resume_from_step(step)
        self._on_resumed()


def _claim(cfg: RunConfig, out: Path,
           invocation: Invocation) -> tuple[RunIdentity, bool, CheckpointManager | None, list[Path]]:
    """``(run identity, whether it is new, checkpointer, a previous run's files to remove)``; raises
    ConfigError / CheckpointError when the run may not use ``out``. Writes nothing."""
    check_output_dir(out)
    checkpoint_dir = Path(cfg.checkpointing.dir).absolute() if cfg.checkpointing.dir else out / "checkpoints"
    resume = cfg.checkpointing.resume
    if resume and invocation.overwrite:
        raise ConfigError(ConfigProblem("command line", "checkpointing.resume", "--overwrite removes the run "
                                        "that checkpointing.resume=true would continue; pass only one of them"))
    if resume:
        check_resume_command(out, invocation.command)
        check_resume_dir(out, checkpoint_dir)
    found = previous_run(out, checkpoint_dir, cfg.run_data_files())
    if found and not resume and not invocation.overwrite:
        refuse_previous_run(out, found)
    stale = found if invocation.overwrite else []
    check_inputs_survive(cfg.model_dump(mode="json"), out, stale)
    identity = read_identity(out) if resume else None
    is_new = identity is None
    identity = identity or RunIdentity.new(invocation.command)
    checkpointer = None
    if cfg.checkpointing.enabled:
        checkpointer = CheckpointManager(cfg.checkpointing, checkpoint_dir, run_id=identity.run_id)
        if resume:
            checkpointer.check_resume()
    return identity, is_new, checkpointer, stale


def start_ray(cluster: ClusterConfig) -> None:
    """Ray from the run's ``cluster:`` section; a cluster that cannot be joined is a config error."""
    try:
        init_ray(cluster)
    except ConnectionError as e:
        message = " ".join(str(e).split())  # one line
        raise ConfigError(ConfigProblem("config", "cluster.address", message)) from None


def _close_logger(logger: MetricsLogger) -> None:
    plot = logger.close()
    if plot is not None:
        print(f"metrics plot: {plot}")
    print(f"metrics: {logger.jsonl_path}")


def logits_width(model_path: str) -> int:
    """The model's output vocabulary size (may exceed the tokenizer's length)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).vocab_size)


def stop_tokens(tokenizer) -> tuple[int, ...]:
    """The token ids that end a model turn (the tokenizer's EOS)."""
    return tuple(t for t in [tokenizer.eos_token_id] if t is not None)
