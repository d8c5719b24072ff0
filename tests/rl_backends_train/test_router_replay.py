"""MoE router replay, the trainer's half (``policy.moe.router_replay``): the experts of a batch's
``routed_experts`` are the ones every MoE layer runs, weighted from the router's own logits (which keep
their gradients), padded or packed alike; the router's own choice where nothing was recorded."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL, make_grouped_batch
from test_dtensor_ray import VOCAB, cfg

from rl_backends_train import build_training_backend, router_replay
from rl_core.models.moe import NOT_RECORDED, moe_routers

FAMILIES = ["qwen3_moe", "glm4_moe_lite", "gpt_oss"]  # one of each router kind: softmax, sigmoid, softmax of top-k


def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def own_routing(path: str, batch) -> torch.Tensor:
    """``[B, T, moe_layers, k]``: the experts a plain HF forward of each row chooses (-1 on padding)."""
    model, chosen = hf_model(path), []
    for router in moe_routers(model):
        router.register_forward_hook(lambda _m, _a, out: chosen.append(out[2]))
    rows = []
    for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
        chosen.clear()
        n = int(mask.sum())
        with torch.no_grad():
            model(input_ids=ids[None, :n])
        record = torch.full((ids.shape[0], len(chosen), chosen[0].shape[1]), NOT_RECORDED, dtype=torch.int16)
        record[:n] = torch.stack(chosen, dim=1)
        rows.append(record)
    return torch.stack(rows)


def forced_routing(batch, moe_layers: int, experts: int) -> torch.Tensor:
    """``[B, T, moe_layers, 2]``: two distinct experts that follow from (token, position, layer) alone, so
    rows sharing a prompt share its routing as generation gives them; -1 on padding and on the first token
    (a position the router chooses for itself)."""
    ids = batch["input_ids"]
    seed = ids[..., None] + torch.arange(ids.shape[1])[None, :, None] + 7 * torch.arange(moe_layers)
    first = seed % experts
    second = (first + 1 + seed // experts % (experts - 1)) % experts
    routing = torch.stack([first, second], dim=-1).to(torch.int16)
    routing[~batch["attention_mask"].bool()] = NOT_RECORDED
    routing[:, 0] = NOT_RECORDED
    return routing


@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_experts_run_with_the_routers_own_weights(family, tiny_family_dir):
    """On a plain HF model: each MoE layer's experts get exactly the recorded ids, weighted as the
    router weights its own top-k, and the router still gets a gradient."""
    path = tiny_family_dir(family)
    batch = make_grouped_batch(VOCAB, [5, 9], [[4, 7], [3, 6]], seed=1)
    model = hf_model(path)
    routers = moe_routers(model)
    experts = routers[0].weight.shape[0]
    routing = forced_routing(batch, len(routers), experts)
    own = own_routing(path, batch)
    seen = []
    for router in routers:
        router.register_forward_hook(lambda _m, _a, out: seen.append(out))
    router_replay.install(model)
    router_replay.set_routing(model, batch | {"routed_experts": routing}, torch.device("cpu"))
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.sum().backward()
    real = batch["attention_mask"].bool().flatten()
    recorded = routing.flatten(0, 1).long()  # [N, moe_layers, 2]
    replayed = recorded[:, 0, 0] != NOT_RECORDED
    for layer, (router, (logits, weights, indices)) in enumerate(zip(routers, seen)):
        assert torch.equal(indices[replayed], recorded[replayed, layer])
        own_layer = own[..., layer, :].flatten(0, 1).long()
        first = real & ~replayed  # the first tokens: the router's own choice
        assert torch.equal(indices[first].sort(-1).values, own_layer[first].sort(-1).values)
        expected = router_replay._weights(router, logits, indices)
        torch.testing.assert_close(weights, expected.to(weights.dtype), rtol=0, atol=0)
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    # replay actually changes the experts of most tokens from the router's own
    assert (seen[0][2][replayed].sort(-1).values != own[..., 0, :].flatten(0, 1).long()[replayed].sort(-1).values
            ).any(-1).float().mean() > 0.3


def test_replaying_the_own_choice_changes_nothing_and_packing_replays_alike(tiny_family_dir):
    """fp32: replaying the experts the model chooses anyway gives its logprobs to 1e-6; forced experts
    give other logprobs, the same padded and packed with shared prompts; a training step under replay
    moves the routers."""
    path = tiny_family_dir("qwen3_moe")
    batch = make_grouped_batch(VOCAB, [5, 9], [[4, 7], [3, 6]], seed=1)
    own = own_routing(path, batch)
    forced = forced_routing(batch, own.shape[2], 4)
    with build_training_backend(cfg(use_ray=False), path) as policy:
        plain = policy.logprobs(batch)
    replay = {"moe": {"router_replay": True}}
    packing = {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 64}
    with build_training_backend(cfg(use_ray=False, **replay), path) as policy:
        torch.testing.assert_close(policy.logprobs(batch | {"routed_experts": own}), plain, rtol=0, atol=1e-6)
        torch.testing.assert_close(policy.logprobs(batch), plain, rtol=0, atol=1e-6)  # nothing recorded
        padded = policy.logprobs(batch | {"routed_experts": forced})
        before = {name: w.clone() for name, w in policy.named_weights()}
        policy.train(batch | {"routed_experts": forced}, MaskedNLL())
        after = dict(policy.named_weights())
    real = batch["attention_mask"].bool()
    assert (padded - plain)[real].abs().max() > 1e-3
    gates = [name for name in before if name.endswith("mlp.gate.weight")]
    assert gates and all((after[name] - before[name]).abs().max() > 0 for name in gates)
    with build_training_backend(cfg(use_ray=False, packing=packing, **replay), path) as policy:
        packed = policy.logprobs(batch | {"routed_experts": forced})
    torch.testing.assert_close(packed[real], padded[real], rtol=0, atol=1e-5)


def test_a_dense_model_and_a_foreign_record_are_refused(tiny_family_dir):
    replay = cfg(use_ray=False, moe={"router_replay": True})
    with pytest.raises(Exception, match="policy.moe.router_replay=true: qwen3 has no mixture-of-experts router"):
        build_training_backend(replay, tiny_family_dir("qwen3"))
    batch = make_grouped_batch(VOCAB, [5], [[4]])
    wrong = torch.zeros(*batch["input_ids"].shape, 5, 2, dtype=torch.int16)  # 5 MoE layers: another model
    with build_training_backend(replay, tiny_family_dir("qwen3_moe")) as policy:
        with pytest.raises(Exception, match="routed_experts records 5 MoE layers but the model has 2"):
            policy.logprobs(batch | {"routed_experts": wrong})


def test_megatron_is_refused():
    with pytest.raises(ValueError, match="moe.router_replay=true is implemented by backend=dtensor, not backend=megatron"):
        cfg(moe={"router_replay": True}, backend="megatron")
