"""LoRA (adapters only, merged weights, export, PEFT-format adapters) and the reward-model task."""

from __future__ import annotations

import json

import torch
from backend_testlib import BradleyTerry, MaskedNLL, make_batch
from safetensors.torch import load_file

from rl_backends_train import LoRAConfig, TrainBackendConfig, build_training_backend
from rl_backends_train.lora import LoRALinear

VOCAB = 500
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def lora_cfg(**overrides) -> TrainBackendConfig:
    base = {"use_ray": False, "optimizer": {"lr": 1e-2}, "lora": LORA, "reference_model": True}
    return TrainBackendConfig(**(base | overrides))


def test_lora_linear_merged_weight_equals_base_plus_adapter():
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 24)
    layer = LoRALinear.wrap(base, LoRAConfig(rank=3, alpha=6.0))
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(5, 16)
    merged = layer.merged_weight(layer.weight, layer.lora_A.weight, layer.lora_B.weight)
    torch.testing.assert_close(layer(x), x @ merged.T + layer.bias, rtol=0, atol=1e-5)
    layer.adapters_enabled = False
    assert torch.equal(layer(x), base(x))
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["lora_A.weight", "lora_B.weight"]


def test_lora_trains_adapters_only_and_exports_merged_weights(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    batch = make_batch(VOCAB, [12, 9, 15, 6])
    with build_training_backend(lora_cfg(), tiny_model_dir) as policy:
        before = policy.logprobs(batch)
        for _ in range(3):
            metrics = policy.train(batch, MaskedNLL())
        after = policy.logprobs(batch)
        base_now = policy.reference_logprobs(batch)  # adapters switched off: the frozen base
        merged = dict(policy.named_weights())
        policy.export_hf(str(tmp_path / "hf"))
        policy.save_adapter(str(tmp_path / "adapter"))
    assert metrics["grad_norm"] > 0 and not torch.allclose(after, before)
    assert torch.equal(base_now, before)  # the base weights did not move

    original = load_file(f"{tiny_model_dir}/model.safetensors")
    assert merged.keys() == original.keys()  # HF names, no adapter tensors
    changed = {n for n in original if not torch.equal(merged[n], original[n])}
    assert changed == {n for n in original if n.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight"))}

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = exported(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(lp[mask], after[:, 1:][mask], rtol=0, atol=1e-5)
    assert (tmp_path / "hf" / "tokenizer.json").is_file()

    adapter = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    name = "model.layers.0.self_attn.q_proj"
    a, b = adapter[f"base_model.model.{name}.lora_A.weight"], adapter[f"base_model.model.{name}.lora_B.weight"]
    torch.testing.assert_close(original[f"{name}.weight"] + 2.0 * b @ a, merged[f"{name}.weight"], rtol=0, atol=1e-6)


def test_lora_checkpoint_holds_adapters_under_peft_names(tiny_model_dir, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    with build_training_backend(lora_cfg(), tiny_model_dir) as policy:
        policy.save(str(tmp_path / "ckpt"))
    keys = set(FileSystemReader(str(tmp_path / "ckpt" / "dcp")).read_metadata().state_dict_metadata)
    assert "model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert "model.model.layers.1.mlp.down_proj.weight" in keys
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["format"] == "rl-dcp" and meta["lora"]["rank"] == 4 and meta["task"] == "causal_lm"


def preference_pairs(n_pairs: int, seed: int) -> dict[str, torch.Tensor]:
    """Rows (chosen, rejected, ...): same random prefix; chosen ends in token 7, rejected in 8.
    ``is_chosen`` marks the layout, so packing keeps each pair together and in order."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_pairs):
        prefix = torch.randint(20, VOCAB, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen)
        rows += [torch.cat([prefix, torch.tensor([7])]), torch.cat([prefix, torch.tensor([8])])]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)] = r, 1
    is_chosen = (torch.arange(len(rows)) % 2 == 0).long()
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": attention.float(), "is_chosen": is_chosen}


def test_reward_model_learns_a_separable_toy_and_exports(tiny_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    cfg = TrainBackendConfig(use_ray=False, task="reward_model", optimizer={"lr": 1e-2}, reference_model=False,
                             packing={"enabled": True, "max_tokens_per_micro_batch": 64})
    train, held_out = preference_pairs(16, seed=0), preference_pairs(16, seed=1)
    with build_training_backend(cfg, tiny_model_dir) as rm:
        first = rm.train(train, BradleyTerry())
        for _ in range(7):
            last = rm.train(train, BradleyTerry())
        scores = rm.scores(held_out)
        rm.export_hf(str(tmp_path / "rm"))
    assert last["loss"] < first["loss"]
    assert (scores[0::2] > scores[1::2]).float().mean() == 1.0
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm", dtype=torch.float32).eval()
    assert type(exported).__name__ == "LlamaForSequenceClassification" and exported.config.num_labels == 1
    # HF pools at the last token that is not its pad id; our batches mark padding by attention_mask.
    ids = held_out["input_ids"].masked_fill(held_out["attention_mask"] == 0, exported.config.pad_token_id)
    with torch.no_grad():
        hf_scores = exported(input_ids=ids, attention_mask=held_out["attention_mask"]).logits[:, 0]
    torch.testing.assert_close(hf_scores, scores, rtol=0, atol=1e-5)


def test_reward_model_scores_agree_between_packed_and_padded(tiny_model_dir):
    pairs = preference_pairs(4, seed=2)
    common = {"use_ray": False, "task": "reward_model", "reference_model": False}
    with build_training_backend(TrainBackendConfig(**common), tiny_model_dir) as padded, \
            build_training_backend(TrainBackendConfig(**common, packing={"enabled": True}), tiny_model_dir) as packed:
        torch.testing.assert_close(packed.scores(pairs), padded.scores(pairs), rtol=0, atol=1e-5)
