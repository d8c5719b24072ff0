"""FP8 linears on the DTensor backend (torchao float8 training; on CPU its emulation mode): an FP8
step against the bf16 step, which modules convert, checkpoints and refit in high precision, errors."""

from __future__ import annotations

import sys

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch
from safetensors.torch import load_file
from torch import nn

from rl_backends_train import TrainBackendConfig, build_training_backend

pytest.importorskip("torchao.float8", reason="needs rl-backends-train[fp8] (torchao)")

VOCAB = 500
PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def fp8_cfg(recipe="tensorwise", **overrides) -> TrainBackendConfig:
    base = {"use_ray": False, "reference_model": False, "optimizer": {"lr": 1e-3}, "dtype": "bfloat16",
            "precision": {"linear": "fp8", "recipe": recipe}}
    return TrainBackendConfig(**(base | overrides))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def step_and_gradients(model_dir, batch, cfg):
    """One step without clipping: its metrics and every parameter's (unclipped) gradient."""
    with build_training_backend(cfg.model_copy(update={"max_grad_norm": None}), model_dir) as policy:
        metrics = policy.train(batch, MaskedNLL())
        model = policy.group._local.worker.model  # the in-process rank
        grads = {name: _full(p.grad).detach().clone() for name, p in model.named_parameters()}
    return metrics, grads


@pytest.mark.parametrize("recipe, dtype", [("tensorwise", "bfloat16"), ("rowwise", "bfloat16"),
                                           ("rowwise_with_gw_hp", "float32")])
def test_fp8_step_is_within_the_rounding_bound_of_the_high_precision_step(tiny_model_dir, skewed_lengths,
                                                                          recipe, dtype):
    """Bounds: e4m3 rounds activations and weights with a relative RMS error of ~2.4% (3 mantissa
    bits), e5m2 the output gradients with ~4.8% (2 bits; tensorwise), and the errors of a weight
    gradient ``x.T @ grad_out`` add up over the layers: measured 5-7% relative L2 difference of the
    whole gradient (<= 12% for one tensor) on this model. Asserted: whole gradient < 10%, every
    tensor < 20%, grad norm < 2%, loss < 1e-3 (a mean over many tokens averages rounding out). And the
    FP8 step is not the high-precision one: the gradients differ by > 0.5%."""
    batch = make_batch(VOCAB, skewed_lengths)
    reference = fp8_cfg(dtype=dtype, precision={})
    ref_metrics, ref_grads = step_and_gradients(tiny_model_dir, batch, reference)
    metrics, grads = step_and_gradients(tiny_model_dir, batch, fp8_cfg(recipe, dtype=dtype))
    assert grads.keys() == ref_grads.keys()
    diff = torch.cat([(grads[n] - ref_grads[n]).flatten() for n in grads]).norm()
    relative = float(diff / torch.cat([g.flatten() for g in ref_grads.values()]).norm())
    assert 0.005 < relative < 0.10
    for name in grads:
        assert float((grads[name] - ref_grads[name]).norm() / ref_grads[name].norm()) < 0.20, name
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=0.02)
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-3)


def test_conversion_skips_the_head_odd_sizes_and_chosen_modules(tiny_tokenizer):
    from torchao.float8.float8_linear import Float8Linear

    from rl_backends_train.config import PrecisionConfig
    from rl_backends_train.fp8 import convert_linears_to_fp8
    from rl_core.models import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    model.model.layers[0].mlp.odd = nn.Linear(64, 24)  # 24 is not a multiple of 16
    precision = PrecisionConfig(linear="fp8", skip_modules=["lm_head", "layers.1.mlp.down_proj"])
    converted = convert_linears_to_fp8(model, precision, torch.device("cpu"), fsdp=False)
    expected = [f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS]
    expected.remove("model.layers.1.mlp.down_proj")
    assert converted == expected
    kinds = {name: type(m) for name, m in model.named_modules()}
    assert all(kinds[name] is Float8Linear for name in expected)
    assert kinds["lm_head"] is nn.Linear and kinds["model.layers.0.mlp.odd"] is nn.Linear
    assert kinds["model.layers.1.mlp.down_proj"] is nn.Linear
    assert kinds["model.embed_tokens"] is nn.Embedding
    assert model.model.layers[0].self_attn.q_proj.config.emulate  # CPU: torchao's emulation mode
    # _scaled_mm wants inner dimensions in multiples of 16; the weight gradient's is the token count.
    assert model.model.layers[0].self_attn.q_proj.config.pad_inner_dim


def test_blockwise_padding_feeds_whole_blocks_and_keeps_the_linear_and_its_gradients():
    """``pad_tokens_to_blocks`` (the CPU-checkable part of recipe blockwise): the wrapped linear sees a
    multiple of 128 rows, and outputs and gradients equal the plain linear's for any token count."""
    from rl_backends_train.fp8 import BLOCKWISE_MULTIPLE, pad_tokens_to_blocks

    torch.manual_seed(0)
    plain = nn.Linear(128, 256, bias=False)
    padded = nn.Linear(128, 256, bias=False)
    padded.load_state_dict(plain.state_dict())
    seen: list[int] = []
    inner = padded.forward  # what the kernel would get: the rows of its flattened input

    def recording(x):
        seen.append(x.numel() // x.shape[-1])
        return inner(x)

    padded.forward = recording
    pad_tokens_to_blocks(padded)
    for shape in [(3, 50, 128), (2, 64, 128), (1, 1, 128)]:
        x = torch.randn(shape)
        x_plain, x_padded = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_plain, out_padded = plain(x_plain), padded(x_padded)
        assert out_padded.shape == out_plain.shape
        torch.testing.assert_close(out_padded, out_plain, rtol=0, atol=1e-6)
        out_plain.square().sum().backward()
        out_padded.square().sum().backward()
        torch.testing.assert_close(x_padded.grad, x_plain.grad, rtol=0, atol=1e-5)
        torch.testing.assert_close(padded.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-5)
        plain.weight.grad = padded.weight.grad = None
    assert seen == [256, 128, 128] and all(rows % BLOCKWISE_MULTIPLE == 0 for rows in seen)


def test_mixture_of_experts_router_and_experts_stay_high_precision(tiny_mixtral_dir):
    from transformers import AutoModelForCausalLM

    from rl_backends_train.config import PrecisionConfig
    from rl_backends_train.fp8 import convert_linears_to_fp8

    model = AutoModelForCausalLM.from_pretrained(tiny_mixtral_dir)
    converted = convert_linears_to_fp8(model, PrecisionConfig(linear="fp8"), torch.device("cpu"), fsdp=False)
    # Attention only: the router (mlp.gate) and the experts' stacked weights are not linears here.
    assert converted == [f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS[:4]]


def test_checkpoint_export_and_refit_carry_the_high_precision_masters(tiny_model_dir, skewed_lengths, tmp_path):
    """dtype bfloat16 puts the model under FSDP2, where tensorwise all-gathers weights in float8 (a
    torchao tensor subclass around the fp32 parameter): refit and export must still be plain fp32."""
    batch = make_batch(VOCAB, skewed_lengths)
    on_disk = load_file(f"{tiny_model_dir}/model.safetensors")
    with build_training_backend(fp8_cfg(), tiny_model_dir) as policy:
        policy.train(batch, MaskedNLL())
        weights = {name: t.clone() for name, t in policy.named_weights()}
        policy.save(str(tmp_path / "ckpt"))
        policy.export_hf(str(tmp_path / "hf"))
        expected_next = policy.train(batch, MaskedNLL())
    assert weights.keys() == on_disk.keys()
    for name, tensor in weights.items():  # what the generation engine receives: normal weights
        assert type(tensor) is torch.Tensor and tensor.dtype == torch.float32 and tensor.shape == on_disk[name].shape
    assert any(not torch.equal(weights[n], on_disk[n]) for n in weights)  # the step moved them

    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert exported.keys() == on_disk.keys()
    assert all(torch.equal(exported[n], weights[n]) for n in weights)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert type(reloaded.model.layers[0].self_attn.q_proj) is nn.Linear
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0, msg=name)

    with build_training_backend(fp8_cfg(), tiny_model_dir) as resumed:
        assert resumed.load(str(tmp_path / "ckpt")) == 1
        loaded = dict(resumed.named_weights())
        assert all(torch.equal(loaded[n], weights[n]) for n in weights)  # DCP round trip: exact
        assert resumed.train(batch, MaskedNLL())["loss"] == expected_next["loss"]


def test_reference_and_logprobs_use_the_same_fp8_forward(tiny_model_dir, skewed_lengths):
    """The reference copy converts like the policy: before any step their logprobs are equal, and
    they differ from the bf16 model's by FP8 rounding only."""
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(fp8_cfg(reference_model=True), tiny_model_dir) as policy:
        logprobs, reference = policy.logprobs(batch), policy.reference_logprobs(batch)
    with build_training_backend(fp8_cfg(precision={}), tiny_model_dir) as plain:
        bf16 = plain.logprobs(batch)
    assert torch.equal(logprobs, reference)
    mask = batch["attention_mask"].bool()
    assert 0 < float((logprobs - bf16)[mask].abs().max()) < 0.1


def test_without_torchao_the_error_names_the_extra(monkeypatch, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r'rl-backends-train\[fp8\]'):
        build_training_backend(fp8_cfg(), tiny_model_dir)


def test_blockwise_on_cpu_is_refused_with_the_alternative(tiny_model_dir):
    with pytest.raises(ValueError, match="recipe=blockwise needs a CUDA GPU.*use tensorwise or rowwise"):
        build_training_backend(fp8_cfg("blockwise"), tiny_model_dir)


@pytest.mark.parametrize("overrides, message", [
    ({"precision": {"linear": "fp8", "recipe": "delayed"}}, "not a recipe of backend=dtensor: use one of tensorwise"),
    ({"precision": {"linear": "fp8", "fp8_format": "e4m3"}}, "fp8_format applies to backend=megatron"),
    ({"precision": {"linear": "fp8"}, "lora": {}}, "fp8 with lora is not supported"),
    ({"precision": {"linear": "fp8"}, "num_workers": 2, "tensor_parallel_size": 2}, "tensor_parallel_size > 1"),
    ({"precision": {"linear": "fp8", "recipe": "blockwise"}}, "set dtype=bfloat16"),
    ({"precision": {"recipe": "rowwise"}}, "precision.recipe only applies with precision.linear=fp8"),
    ({"backend": "megatron", "precision": {"linear": "fp8", "recipe": "rowwise"}}, "backend=megatron: use one of"),
    ({"backend": "megatron", "precision": {"linear": "fp8", "skip_modules": ["lm_head"]}}, "apply to backend=dtensor"),
])
def test_precision_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainBackendConfig(**overrides)


def test_two_fsdp_ranks_all_gather_float8_weights_and_track_one_rank(ray_session, tiny_model_dir, skewed_lengths):
    """dp=2 (gloo): FSDP2 shards the Float8Linear weights and all-gathers them in float8. Weight scales
    come from the whole weight (an amax all-reduce), activation scales from each rank's rows, so the
    step tracks one rank's FP8 step within FP8 rounding, not exactly."""
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(fp8_cfg(), tiny_model_dir) as single:
        expected = single.train(batch, MaskedNLL())
        expected_logprobs = single.logprobs(batch)
    with build_training_backend(fp8_cfg(use_ray=True, num_workers=2), tiny_model_dir) as double:
        metrics = double.train(batch, MaskedNLL())
        logprobs = double.logprobs(batch)
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-3)
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=0.02)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise",
                                    # torchao compiles its blockwise triton kernels on first use (~140 s
                                    # on an H200 beside the other lanes of gpu_check.sh)
                                    pytest.param("blockwise", marks=pytest.mark.timeout(300))])
def test_fp8_on_cuda_tracks_bf16_and_refits_plain_weights(tmp_path, skewed_lengths, recipe):
    """torch._scaled_mm (SM 8.9+; blockwise: torchao's triton kernels, SM 9.0) under FSDP2 on one GPU,
    tensorwise with float8 all-gather. A model whose linears are multiples of 128 (blockwise's rule)."""
    if torch.cuda.get_device_capability() < ((9, 0) if recipe == "blockwise" else (8, 9)):
        pytest.skip(f"recipe {recipe} needs a newer GPU")
    from rl_core.models import save_tiny_model

    model_dir = str(save_tiny_model(tmp_path / "tiny-128", hidden_size=128, intermediate_size=256,
                                    num_attention_heads=2, num_key_value_heads=2, head_dim=64))
    batch = make_batch(VOCAB, skewed_lengths)
    on_gpu = {"gpus_per_worker": 1}
    ref_metrics, ref_grads = step_and_gradients(model_dir, batch, fp8_cfg(precision={}, **on_gpu))
    metrics, grads = step_and_gradients(model_dir, batch, fp8_cfg(recipe, **on_gpu))
    diff = torch.cat([(grads[n] - ref_grads[n]).flatten() for n in grads]).norm()
    assert 0.001 < float(diff / torch.cat([g.flatten() for g in ref_grads.values()]).norm()) < 0.10
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-3)
    with build_training_backend(fp8_cfg(recipe, **on_gpu), model_dir) as policy:
        layer = policy.group._local.worker.model.model.layers[0]
        assert type(layer.mlp.down_proj).__name__ == ("Float8BlockwiseLinear" if recipe == "blockwise" else "Float8Linear")
        policy.train(batch, MaskedNLL())
        weights = dict(policy.named_weights())
    on_disk = load_file(f"{model_dir}/model.safetensors")
    assert weights.keys() == on_disk.keys()
    assert all(type(t) is torch.Tensor and t.dtype == torch.float32 and t.device.type == "cpu" for t in weights.values())
