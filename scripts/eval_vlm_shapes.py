"""Held-out greedy accuracy of a vision-language model on shapes chats, with HF ``generate`` (the reference until
the native engine takes images: docs/vlm.md).

    python scripts/eval_vlm_shapes.py runs/sft_vlm_shapes          # the run's start model, checkpoints and hf/
    python scripts/eval_vlm_shapes.py runs/sft_vlm_shapes --json curve.json

For a run directory of ``rl sft --config sft_vlm_shapes``: every model of the run (its ``model`` at step 0, each
``checkpoints/step_*/policy`` converted with rl-checkpoint, and ``hf/``) answers each held-out chat of
``<run>/data/validation.jsonl`` greedily (prompt = the chat without its reply); the shapes grader
(``rl_environments.shapes``: exactly one ``\\boxed{}`` with the right colour) scores it. Prints one line per model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch


def greedy_replies(model_dir: str, prompts: list[list[dict]], batch_size: int, max_new_tokens: int) -> list[str]:
    """Each prompt's greedy reply (left-padded batches through the model's processor)."""
    from transformers import AutoModelForImageTextToText

    from rl_core.images import message_images
    from rl_core.models.processor import load_processor

    processor = load_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    replies = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        texts = [processor.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in chunk]
        inputs = processor(text=texts, images=[message_images(p) for p in chunk], padding=True,
                           padding_side="left", return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[:, inputs["input_ids"].shape[1]:]
        replies += processor.tokenizer.batch_decode(new, skip_special_tokens=True)
    return replies


def accuracy(model_dir: str, chats, batch_size: int = 32, max_new_tokens: int = 16) -> float:
    """Fraction of ``chats`` (ImageChat rows ending with the reference reply) the model answers correctly."""
    from rl_environments.shapes import ShapesEnvironment

    grader = ShapesEnvironment()
    prompts = [chat.messages[:-1] for chat in chats]
    replies = greedy_replies(model_dir, prompts, batch_size, max_new_tokens)
    scores = [grader.step(p + [{"role": "assistant", "content": r}], chat.fields, None).reward_components["correct"]
              for p, r, chat in zip(prompts, replies, chats)]
    return sum(scores) / len(scores)


def run_models(run_dir: Path) -> list[tuple[int | str, Path]]:
    """``(step, model)`` of the run: its start model, its checkpoints, its final export."""
    import yaml

    from rl_core.models import resolve_model

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    models: list[tuple[int | str, Path]] = [(0, Path(resolve_model(config["model"])))]
    models += [(int(step.name.split("_")[1]), step / "policy")
               for step in sorted((run_dir / "checkpoints").glob("step_*")) if (step / "policy").is_dir()]
    if (run_dir / "hf" / "config.json").is_file():
        models.append(("hf", run_dir / "hf"))
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", type=Path, help="held-out chats (default: <run_dir>/data/validation.jsonl)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also write {step: accuracy} here")
    args = parser.parse_args(argv)
    from rl_checkpoint import to_hf
    from rl_core.image_files import load_image_chats

    torch.set_num_threads(1)  # docs/vlm.md: one thread per process is fastest on the shared 2-core machine
    chats = load_image_chats(args.data or args.run_dir / "data" / "validation.jsonl")
    results = {}
    with tempfile.TemporaryDirectory(prefix="eval-vlm-") as tmp:
        for step, model in run_models(args.run_dir):
            model_dir = model
            if not (model / "config.json").is_file():  # a DCP checkpoint
                model_dir = Path(tmp) / f"step_{step}"
                to_hf(model, model_dir)
            results[str(step)] = accuracy(str(model_dir), chats, args.batch_size)
            print(f"step {step}: held-out greedy accuracy {results[str(step)]:.3f} ({len(chats)} chats)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
