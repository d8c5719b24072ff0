"""One GRPO step on the same episodes has TRL's gradient: our pipeline (episodes -> batch -> group advantages ->
the DTensor policy's packed forward and loss -> gradients) against TRL's GRPOTrainer._compute_loss on the same
prompt and completion tokens, for each loss reduction bench/trl_grpo_arith.py maps (token: ``dapo``, sequence:
``grpo``, constant: ``dr_grpo``), with the main recipe's KL term to a reference model (TRL's ``beta``, k3; both sides
get the same reference logprobs, a little off the policy's so that the KL has a gradient). This is why docs/learning.md
can compare the two libraries' curves: per step they make the same update, so what differs is the samples each
draws."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# Two prompts x three completions: lengths differ, one hits max_new_tokens without EOS (all its tokens count).
PROMPTS = [[5, 17, 23, 42, 8], [9, 31, 12]]
COMPLETIONS = [[[44, 45, 46, None], [50, None], [60, 61, 62, 63, 64, 65]],
               [[70, 71, None], [80, 81, 82, 83, 84, 85], [90, None]]]  # None: the EOS token
REWARDS = [[1.0, 0.0, 0.5], [0.0, 2.0, 0.0]]
MAX_NEW_TOKENS = 6


def load_trl_mirror():
    spec = importlib.util.spec_from_file_location("trl_grpo_arith", ROOT / "bench" / "trl_grpo_arith.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def episodes(eos: int):
    from rl_algorithms.rollout.episode import Episode
    from rl_core.types import PromptSample

    out = []
    for group, (prompt, completions, rewards) in enumerate(zip(PROMPTS, COMPLETIONS, REWARDS)):
        for index, (completion, reward) in enumerate(zip(completions, rewards)):
            tokens = [eos if t is None else t for t in completion]
            out.append(Episode(sample=PromptSample(messages=[{"role": "user", "content": "q"}]),
                               token_ids=prompt + tokens, loss_mask=[0] * len(prompt) + [1] * len(tokens),
                               gen_logprobs=[0.0] * (len(prompt) + len(tokens)), prompt_length=len(prompt),
                               reward=reward, truncated=None not in completion, group_id=group, sample_index=index))
    return out


def reference_logprob(row: int, position: int, vocab_size: int) -> float:
    """The reference model's logprob of completion token ``position`` of ``row``: near a random tiny model's own
    (-log V), 0.3 above or below it in turn, so that every token's KL term is small but not zero."""
    return -math.log(vocab_size) + (0.3 if (row + position) % 2 else -0.3)


def our_gradients(cfg, model_path: str, eos: int, pad: int, vocab_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    from rl_algorithms.grpo.rewards import compute_rewards_and_advantages
    from rl_algorithms.rollout import episodes_to_batch
    from rl_backends_train import build_training_backend

    eps = episodes(eos)
    batch = episodes_to_batch(eps, pad)
    compute_rewards_and_advantages(eps, batch, cfg.grpo, cfg.loss)
    batch["ref_logprobs"] = torch.zeros_like(batch["gen_logprobs"])  # [B, T], aligned with the tokens
    for row, ep in enumerate(eps):
        for position in range(len(ep.token_ids) - ep.prompt_length):
            batch["ref_logprobs"][row, ep.prompt_length + position] = reference_logprob(row, position, vocab_size)
    policy = build_training_backend(cfg.policy, model_path, seed=0)
    try:
        worker = policy.group._local.worker
        grads: dict[str, torch.Tensor] = {}
        step = worker.optimizers[0].step

        def capture(*args, **kwargs):  # the gradients the optimizer is about to apply
            for name, param in worker.model.named_parameters():
                grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
                grads[name] = grad.detach().clone()
            return step(*args, **kwargs)

        worker.optimizers[0].step = capture
        policy.train(batch, cfg.loss.build(), temperature=cfg.grpo.temperature)
    finally:
        policy.shutdown()
    return grads, batch["advantages"]


def trl_gradients(cfg, model_path: str, tokenizer, tmp_path: Path, vocab_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """TRL's loss on the same tokens, with the inputs GRPOTrainer builds: left-padded prompts, right-padded
    completions masked after the first EOS, group-normalised advantages (its formula, std + 1e-4)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    mirror = load_trl_mirror()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=mirror.trl_config(cfg, tmp_path, 0), train_dataset=Dataset.from_list([{"prompt": "q"}]),
                          processing_class=tokenizer)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = [p for p, completions in zip(PROMPTS, COMPLETIONS) for _ in completions]
    completions = [[eos if t is None else t for t in c] for group in COMPLETIONS for c in group]
    rows, prompt_width, width = len(prompts), max(map(len, prompts)), max(map(len, completions))
    prompt_ids, prompt_mask = torch.full((rows, prompt_width), pad), torch.zeros(rows, prompt_width, dtype=torch.long)
    completion_ids, completion_mask = torch.full((rows, width), pad), torch.zeros(rows, width, dtype=torch.long)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        prompt_ids[row, prompt_width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[row, prompt_width - len(prompt):] = 1
        completion_ids[row, :len(completion)] = torch.tensor(completion)
        completion_mask[row, :completion.index(eos) + 1 if eos in completion else len(completion)] = 1
    rewards = torch.tensor(REWARDS)
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + 1e-4)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages.flatten(),
              "num_items_in_batch": completion_mask.sum(),
              "ref_per_token_logps": torch.tensor([[reference_logprob(row, position, vocab_size) for position in range(width)]
                                                   for row in range(rows)])}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which this skips
    trainer._compute_loss(trainer.model, inputs).backward()
    return {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters()}, advantages.flatten()


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
def test_one_step_on_the_same_episodes_has_trls_gradient(tmp_path, tiny_model_dir, reduction):
    pytest.importorskip("trl")
    from transformers import AutoConfig, AutoTokenizer

    mirror = load_trl_mirror()
    # The main job's settings (temperature 0.7, clip 0.2 / 0.28, std-normalised group advantages, KL 0.04, packing
    # with shared prompts), on the tiny model; no clipping of the gradient norm, so the raw gradients compare.
    cfg = mirror.load_recipe("grpo_arithmetic_smollm2.yaml", [
        f"model={tiny_model_dir}", f"loss.reduction={reduction}", "grpo.batch_size=2",
        "grpo.num_generations_per_prompt=3", f"grpo.max_new_tokens={MAX_NEW_TOKENS}", "policy.max_grad_norm=null"])
    assert not mirror.unsupported(cfg) and cfg.loss.kl_coef == 0.04
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab_size = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    ours, our_advantages = our_gradients(cfg, tiny_model_dir, tokenizer.eos_token_id, tokenizer.pad_token_id, vocab_size)
    theirs, their_advantages = trl_gradients(cfg, tiny_model_dir, tokenizer, tmp_path, vocab_size)

    torch.testing.assert_close(our_advantages, their_advantages, rtol=2e-4, atol=2e-4)  # TRL's std + 1e-4
    assert set(ours) == set(theirs)
    norm = torch.sqrt(sum(g.pow(2).sum() for g in theirs.values()))
    assert norm > 0
    for name, grad in theirs.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-3, atol=1e-3 * float(norm) / grad.numel() ** 0.5,
                                   msg=lambda m, name=name: f"{name}: {m}")
