"""``rl <command> --dry-run``: everything a run checks before it writes, and nothing more.

The config is resolved (by the CLI), the model and tokenizer are resolved and checked (config and
weight headers; the model is built on the meta device to count its parameters, its weights are not
read), the data is read and every row checked by the command's own loaders, and one sample is printed
as the model will see it: the templated text with the tokens that carry loss between ⟦ and ⟧, and its
token counts. No output directory, log, checkpoint or Ray cluster is created (a model name such as
``tiny-llama`` may be built into the model cache once, as any command does).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_apps.preview import describe_model, describe_splits, out, show_messages_prompt, show_prompt, show_sample
from rl_apps.run_setup import load_splits, resolve_with_tokenizer, start_run
from rl_apps.vision_setup import image_chat_tokenizer


def dry_run(command: str, cfg: Any) -> int:
    """Check and show what ``rl <command>`` would train on; returns 0 (a bad input raises as a real run would)."""
    if command not in PREVIEWS:
        print(f"rl {command}: --dry-run is not available for this command (add it to rl_apps/dry_run.py)",
              file=sys.stderr)
        return 2
    out(f"rl {command} --dry-run: checks the model and the data; writes nothing, starts no Ray")
    PREVIEWS[command](cfg)
    output_dir = getattr(cfg, "output_dir", None)
    where = f" ({output_dir} was not created)" if output_dir and not Path(output_dir).exists() else ""
    out(f"dry run: config, model, tokenizer and data are fine; nothing was written{where}")
    return 0


def _grpo(cfg) -> None:
    from rl_algorithms.grpo import prompt_length_check
    from rl_apps.commands.grpo import build_env

    build_env(cfg.env, "env")
    if cfg.val_env is not None:
        build_env(cfg.val_env, "val_env")
    model_path, tokenizer = start_run(cfg)
    describe_model("model", cfg.model, model_path, tokenizer)
    tokenizer = image_chat_tokenizer(model_path, tokenizer)
    check = prompt_length_check(tokenizer, cfg.grpo.max_total_length, cfg.generation.max_seq_len)
    train = cfg.data.load("train", check=check)
    val = cfg.data.load("validation", cfg.grpo.val_num_prompts, check) if cfg.grpo.val_every > 0 else None
    describe_splits(train, val, synthetic=False)
    sample = train.items[0]
    show_messages_prompt("sample    training prompt 1", tokenizer, sample.messages,
                         f"graded by env.name={cfg.env.name!r}; the loss is on the policy's {cfg.grpo.num_generations_per_prompt} "
                         f"samples of up to grpo.max_new_tokens={cfg.grpo.max_new_tokens} tokens each",
                         sample.metadata, model_path)


def _supervised(load: Callable[[Any, Any], Callable[[str], Any]], show: Callable[[Any, Any], None]):
    """A preview of an SFT / DPO / RM run: ``load(cfg, tokenizer)`` is the command's loader of one file,
    ``show(tokenizer, item)`` prints one loaded item."""

    def preview(cfg) -> None:
        model_path, tokenizer = start_run(cfg)
        describe_model("model", cfg.model, model_path, tokenizer)
        train, val = load_splits(cfg, load(cfg, tokenizer))
        describe_splits(train, val, synthetic=cfg.synthetic_data is not None)
        show(tokenizer, train.items[0])

    return preview


def _sft(cfg) -> None:
    from rl_apps.commands.sft import chat_loader
    from rl_apps.preview import image_notes

    model_path, tokenizer = start_run(cfg)
    describe_model("model", cfg.model, model_path, tokenizer)
    train, val = load_splits(cfg, chat_loader(cfg, model_path, tokenizer))
    describe_splits(train, val, synthetic=cfg.synthetic_data is not None)
    sample = train.items[0]
    show_sample("sample    training row 1", tokenizer, sample.input_ids, sample.loss_mask,
                images=image_notes(model_path, sample.input_ids, sample.image_inputs))


def _load_pairs(cfg, tokenizer):
    from rl_algorithms.data import load_preference_dataset

    return lambda path: load_preference_dataset(path, cfg.data, tokenizer)


def _show_pair(tokenizer, pair) -> None:
    chosen, rejected = pair
    show_sample("sample    training pair 1, chosen", tokenizer, chosen.input_ids, chosen.loss_mask)
    show_sample("sample    training pair 1, rejected", tokenizer, rejected.input_ids, rejected.loss_mask)


def _distill(cfg) -> None:
    from rl_algorithms.data import load_prompt_dataset
    from rl_apps.commands.distill import checked_vocab_size

    student_path, tokenizer = start_run(cfg)
    teacher_path, teacher_tokenizer = resolve_with_tokenizer(cfg.teacher.model)
    describe_model("student", cfg.model, student_path, tokenizer)
    describe_model("teacher", cfg.teacher.model, teacher_path, teacher_tokenizer)
    checked_vocab_size(cfg, student_path, tokenizer, teacher_path, teacher_tokenizer)
    train, val = load_splits(cfg, lambda path: load_prompt_dataset(path, cfg.data, tokenizer))
    describe_splits(train, val, synthetic=cfg.synthetic_data is not None)
    show_sample("sample    training prompt 1", tokenizer, train.items[0])
    out(f"{'':<10}the loss is on the student's samples of up to distill.max_new_tokens={cfg.distill.max_new_tokens} "
        f"tokens, against the teacher's top {cfg.distill.teacher_top_k} logits")


def _xtoken(cfg) -> None:
    from rl_algorithms.data import load_text_dataset
    from rl_algorithms.xtoken import XTokenTokenizers, build_vocab_projection, build_xtoken_batches

    student_path, student_tokenizer = start_run(cfg)
    teacher_path, teacher_tokenizer = resolve_with_tokenizer(cfg.teacher.model)
    describe_model("student", cfg.model, student_path, student_tokenizer)
    describe_model("teacher", cfg.teacher.model, teacher_path, teacher_tokenizer)
    tokenizers = XTokenTokenizers.build(student_tokenizer, teacher_tokenizer)
    projection = build_vocab_projection(student_tokenizer, teacher_tokenizer)
    out(f"{'':<10}vocabulary projection: {projection.num_exact} exact, {projection.num_first_token} first-token, "
        f"{projection.num_unmapped} unmapped student tokens")
    both = [student_tokenizer, teacher_tokenizer]
    train, val = load_splits(cfg, lambda path: load_text_dataset(path, cfg.data, both))
    describe_splits(train, val, synthetic=cfg.synthetic_data is not None)
    student, teacher = build_xtoken_batches(train.items[:1], tokenizers)
    show_sample("sample    training text 1, student tokens", student_tokenizer,
                student["input_ids"][0][student["attention_mask"][0].bool()].tolist(),
                student["loss_mask"][0][student["attention_mask"][0].bool()].tolist())
    aligned = int(student["xtoken_aligned_mask"][0].sum())
    out(f"{'':<10}teacher tokens: {int(teacher['attention_mask'][0].sum())}; student positions aligned with a "
        f"teacher position: {aligned}")


def _eval(cfg) -> None:
    from rl_eval.models import hf_model_dir, load_tokenizer
    from rl_eval.runner import render_prompt

    datasets = [(d, d.name or d.data.default_name(), d.data.build(f"datasets.{i}.data"))
                for i, d in enumerate(cfg.datasets)]
    with hf_model_dir(cfg.model) as model_dir:
        tokenizer = load_tokenizer(model_dir)
        describe_model("model", cfg.model, model_dir, tokenizer)
        for dataset, name, samples in datasets:
            out(f"{'data':<10}{name}: {len(samples)} items, graded by {dataset.grader_config().name!r}")
            prompt = render_prompt(tokenizer, samples[0], dataset.prompt_template)
            show_prompt(f"sample    {name}, item 1", tokenizer, prompt, model_dir)
            if samples[0].metadata:
                out(f"{'':<10}metadata: {samples[0].metadata}")
        out(f"{'':<10}{cfg.sampling.n} samples per item of up to sampling.max_new_tokens={cfg.sampling.max_new_tokens} "
            f"tokens; k_values={cfg.k_values}")


PREVIEWS: dict[str, Callable[[Any], None]] = {
    "grpo": _grpo,
    "sft": _sft,
    "dpo": _supervised(_load_pairs, _show_pair),
    "rm": _supervised(_load_pairs, _show_pair),
    "distill": _distill,
    "xtoken-distill": _xtoken,
    "eval": _eval,
}
"""What ``--dry-run`` checks and shows, per command."""
