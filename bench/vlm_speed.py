"""vlm-speed: how fast the tiny VLMs train and generate on this machine, to size the CPU recipes.

    python bench/vlm_speed.py                       # every family, the preset sizes
    python bench/vlm_speed.py --families qwen2_5_vl --sizes s m --threads 2

For each family and size: a batch of ``--batch`` shapes prompts (image + question) with their boxed answers,
timed for forward + backward + AdamW step (fp32, padded batch, loss on the answer tokens), and HF
``generate`` of ``--new-tokens`` tokens (greedy, left-padded batch). Prints one line per case with the
median of ``--repeats`` timings after one warm-up; parameter counts split into vision tower and the rest.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

# name: (image_size, patch_size, text overrides, vision overrides)
SIZES = {
    "xs": (32, 8, {}, {"num_attention_heads": 2}),
    "s": (64, 8, {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4},
          {"hidden_size": 64, "intermediate_size": 128}),
    "m": (64, 8, {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                  "num_key_value_heads": 2}, {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4}),
}


def _batch(processor, family, samples, with_answer):
    from rl_core.images import message_images

    texts, images = [], []
    for sample in samples:
        messages = sample.messages + ([{"role": "assistant", "content": f"\\boxed{{{sample.metadata['answer']}}}"}]
                                      if with_answer else [])
        texts.append(processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=not with_answer))
        found = message_images(messages)
        images.append(found if family == "idefics3" else found[0])
    processor.tokenizer.padding_side = "right" if with_answer else "left"
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


def _time(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(family, size, batch_size, new_tokens, repeats):
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor
    from rl_core.models.tiny_vlm import save_tiny_vlm
    from rl_environments.shapes import ShapesDatasetConfig

    image_size, patch, text, vision = SIZES[size]
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_vlm(tmp, family=family, image_size=image_size, patch_size=patch, text=text, vision=vision)
        model = AutoModelForImageTextToText.from_pretrained(tmp)
        processor = load_processor(tmp)
    samples = ShapesDatasetConfig(image_size=image_size, grid=2, max_shapes=3).build("train", batch_size)
    train = _batch(processor, family, samples, with_answer=True)
    prompts = _batch(processor, family, samples, with_answer=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        model.train()
        logits = model(**train).logits[:, :-1]
        targets = train["input_ids"][:, 1:]
        mask = train["attention_mask"][:, 1:].float()
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
        loss = -(logprobs * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def generate():
        model.eval()
        with torch.no_grad():
            model.generate(**prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    vision_tower = getattr(model.model, "visual", None) or model.model.vision_model
    n_vision = sum(p.numel() for p in vision_tower.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    train_s, gen_s = _time(step, repeats), _time(generate, repeats)
    print(f"{family:11s} {size:3s} image {image_size}px/{patch}px-patches  params {n_all / 1e6:.2f}M "
          f"(vision {n_vision / 1e6:.2f}M)  tokens/prompt {prompts['input_ids'].shape[1]} "
          f"(+answer {train['input_ids'].shape[1]})  fwd+bwd+adamw {train_s * 1e3:.0f} ms  "
          f"generate {new_tokens} tok {gen_s * 1e3:.0f} ms ({batch_size * new_tokens / gen_s:.0f} tok/s)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["qwen2_5_vl", "qwen3_vl", "idefics3"])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for family in args.families:
        for size in args.sizes:
            bench(family, size, args.batch, args.new_tokens, args.repeats)


if __name__ == "__main__":
    main()
