"""The engine's own paths for the layers it used to take from transformers: the expert dispatch
(``native/moe.py``) and the single-token updates of the gated delta rule and Mamba-2
(``native/recurrent_steps.py``), each exact (fp32) to transformers' reference and used by the engine; and
the half-precision decode attention on CPU (``native/attention.py``), grouped matmuls instead of SDPA."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from rl_backends_gen.native import NativeEngine, attention, layers, moe, recurrent_steps
from rl_backends_gen.native.cache import AttentionKV, EngineCache
from rl_backends_gen.native.steps import DecodeStep
from rl_core.models.tiny import build_tiny_model, build_tiny_tokenizer
from rl_core.types import SamplingParams

# Every family of rl_core.models.tiny.FAMILIES whose MoE block is a transformers experts module.
EXPERTS = ["glm4_moe_lite", "gpt_oss", "mixtral", "nemotron_h", "qwen3_5_moe_text", "qwen3_moe"]


def experts_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if moe._is_experts(m)]


@pytest.mark.parametrize("family", EXPERTS)
def test_expert_dispatch_equals_transformers_eager_experts(family):
    """Random tokens routed to random experts (some hit by no token, others by many; k of each token
    distinct), random routing weights: the engine's forward equals the module's eager forward."""
    model = build_tiny_model(build_tiny_tokenizer(), family=family)
    reference = experts_modules(model)[0]
    with torch.no_grad():  # the tiny models leave some expert weights at 0: give every one values
        for weight in reference.parameters():
            weight.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(1))
    ours = copy.deepcopy(reference)
    assert moe.install(ours) == 1
    gen = torch.Generator().manual_seed(0)
    experts, k = reference.num_experts, 2
    tokens = 13
    hidden = torch.randn(tokens, reference.down_proj.shape[2 if reference.is_transposed else 1], generator=gen)
    used = torch.arange(experts - 1)  # the last expert: no token at all
    index = torch.stack([used[torch.randperm(len(used), generator=gen)[:k]] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=gen)
    with torch.no_grad():
        want = type(reference).forward.__wrapped__(reference, hidden, index, weights)  # the eager loop
        got = ours(hidden, index, weights)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    assert want.abs().max().item() > 0.1  # a real comparison, not of zeros
    for name, weight in reference.named_parameters():  # same values, only the memory layout differs
        assert torch.equal(getattr(ours, name), weight), name


def test_refit_keeps_the_relaid_expert_weights(tmp_path):
    """``update_weights`` copies into the relaid parameters in place: the engine then computes with the
    new values (the experts' output changes to the new module's)."""
    from rl_core.models import save_tiny_model

    path = str(save_tiny_model(tmp_path, family="qwen3_moe"))
    engine = NativeEngine(path, max_batch_size=2, max_seq_len=32)
    ours = experts_modules(engine.model)[0]
    assert ours.forward.__func__ is moe.experts_forward
    assert ours.gate_up_proj.transpose(1, 2).is_contiguous()  # [E, in, out] in memory
    fresh = copy.deepcopy(ours)
    with torch.no_grad():
        fresh.gate_up_proj.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(2))
    engine.update_weights([("model.layers.0.mlp.experts.gate_up_proj", fresh.gate_up_proj.detach().clone())])
    hidden, index, weights = torch.randn(5, ours.down_proj.shape[1]), torch.tensor([[0, 1]] * 5), torch.ones(5, 2)
    with torch.no_grad():
        want = type(fresh).forward.__wrapped__(fresh, hidden, index, weights)
        assert (ours(hidden, index, weights) - want).abs().max().item() <= 1e-5
    assert ours.gate_up_proj.transpose(1, 2).is_contiguous()


def reference_delta_rule():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    return torch_recurrent_gated_delta_rule


def test_gated_delta_step_equals_transformers_recurrent_rule_over_several_steps():
    """5 rows, 4 heads, key dim 8 / value dim 16, 6 tokens one at a time from a random state: the same
    outputs and states as transformers' recurrent rule, the state updated in place."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, k_dim, v_dim = 5, 4, 8, 16
    state = torch.randn(rows, heads, k_dim, v_dim, generator=gen)
    theirs, ours = state.clone(), state.clone()
    buffer = ours.data_ptr()
    for _ in range(6):
        query, key = (torch.randn(rows, 1, heads, k_dim, generator=gen) for _ in range(2))
        value = torch.randn(rows, 1, heads, v_dim, generator=gen)
        g, beta = -torch.rand(rows, 1, heads, generator=gen) * 2, torch.rand(rows, 1, heads, generator=gen)
        want, theirs = reference_delta_rule()(query, key, value, g=g, beta=beta, initial_state=theirs,
                                              output_final_state=True, use_qk_l2norm_in_kernel=True)
        got = recurrent_steps.gated_delta_step(query, key, value, g, beta, ours)
        assert got.shape == want.shape == (rows, 1, heads, v_dim)
        assert (got - want).abs().max().item() <= 1e-5
        assert (ours - theirs).abs().max().item() <= 1e-5
    assert ours.data_ptr() == buffer and ours.abs().max().item() > 0.1


def test_a_decode_step_updates_the_states_block_by_block_as_all_at_once(monkeypatch):
    """The decode update runs over blocks of (row, head) states (here 3 of 5 x 4, the last block 2): the
    same outputs and states as one update over all of them, each block in place in the cache's state."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, k_dim, v_dim = 5, 4, 8, 16
    state = torch.randn(rows, heads, k_dim, v_dim, generator=gen)
    whole, blocked = state.clone(), state.clone()
    sizes = []
    update = recurrent_steps._delta_update
    monkeypatch.setattr(recurrent_steps, "_delta_update", lambda *a: sizes.append(a[-1].shape[0]) or update(*a))
    monkeypatch.setattr(recurrent_steps, "STATE_BLOCK_BYTES", 3 * k_dim * v_dim * 4)
    for _ in range(3):
        query, key = (torch.randn(rows, 1, heads, k_dim, generator=gen) for _ in range(2))
        value = torch.randn(rows, 1, heads, v_dim, generator=gen)
        g, beta = -torch.rand(rows, 1, heads, generator=gen), torch.rand(rows, 1, heads, generator=gen)
        want = recurrent_steps.gated_delta_steps(query, key, value, g, beta, whole)
        got = recurrent_steps.gated_delta_step(query, key, value, g, beta, blocked)
        assert (got - want).abs().max().item() <= 1e-6 and (blocked - whole).abs().max().item() <= 1e-6
    assert sizes == [20, 3, 3, 3, 3, 3, 3, 2] * 3
    assert (blocked - state).abs().max().item() > 0.1


def test_decode_updates_are_blocked_on_cpu_only(monkeypatch):
    """The blocks fit a CPU core's L2; on another device (here "meta", which runs the same ops on shapes only,
    standing in for CUDA) a decode update is one block: every block is four more kernel launches there."""
    sizes = []
    update = recurrent_steps._delta_update
    monkeypatch.setattr(recurrent_steps, "_delta_update", lambda *a: sizes.append(a[-1].shape[0]) or update(*a))
    rows, heads, dim = 64, 8, 64  # 8 MB of float32 states: 8 blocks of 1 MB on CPU
    for device in ("cpu", "meta"):
        query, key, value = (torch.zeros(rows, 1, heads, dim, device=device) for _ in range(3))
        g, beta = torch.zeros(rows, 1, heads, device=device), torch.zeros(rows, 1, heads, device=device)
        recurrent_steps.gated_delta_step(query, key, value, g, beta, torch.zeros(rows, heads, dim, dim, device=device))
    assert sizes == [64] * 8 + [512]
    mamba_blocks = []
    blocks = recurrent_steps.state_blocks
    monkeypatch.setattr(recurrent_steps, "state_blocks", lambda flat, size: mamba_blocks.append(size) or blocks(flat, size))
    for device in ("cpu", "meta"):
        x, dt = torch.zeros(4, 2, 8, device=device), torch.zeros(4, 2, device=device)
        a = d = torch.zeros(2, device=device)
        b = c = torch.zeros(4, 1, 16, device=device)
        recurrent_steps.mamba2_step(x, dt, a, b, c, d, torch.zeros(4, 2, 8, 16, device=device))
    assert mamba_blocks == [recurrent_steps.STATE_BLOCK_BYTES, None]


def test_a_mamba2_decode_step_updates_the_states_block_by_block_as_all_at_once(monkeypatch):
    """Mamba-2's decode update over blocks of 3 of the 4 rows x 2 heads' states equals one update over all."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, groups, head_dim, size = 4, 2, 1, 8, 16
    state = torch.randn(rows, heads, head_dim, size, generator=gen)
    whole, blocked = state.clone(), state.clone()
    a, d = -torch.rand(heads, generator=gen), torch.rand(heads, generator=gen)
    for _ in range(3):
        x, dt = torch.randn(rows, heads, head_dim, generator=gen), torch.rand(rows, heads, generator=gen)
        b, c = (torch.randn(rows, groups, size, generator=gen) for _ in range(2))
        monkeypatch.setattr(recurrent_steps, "STATE_BLOCK_BYTES", None)
        want = recurrent_steps.mamba2_step(x, dt, a, b, c, d, whole)
        monkeypatch.setattr(recurrent_steps, "STATE_BLOCK_BYTES", 3 * head_dim * size * 4)
        assert len(recurrent_steps.state_blocks(blocked.view(-1, head_dim, size), recurrent_steps.STATE_BLOCK_BYTES)) == 3
        got = recurrent_steps.mamba2_step(x, dt, a, b, c, d, blocked)
        assert (got - want).abs().max().item() <= 1e-6 and (blocked - whole).abs().max().item() <= 1e-6
    assert (blocked - state).abs().max().item() > 0.1


def test_gated_delta_steps_equal_the_chunked_reference_across_a_chunk_and_padding():
    """The token loop of a prefill (3 rows, 70 tokens: past one 64-token chunk, from a random state, the
    last tokens of two rows padding with no decay and no write) gives the chunked reference's outputs and
    final state; the state is updated in place."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    gen = torch.Generator().manual_seed(0)
    rows, tokens, heads, k_dim, v_dim = 3, 70, 4, 32, 32
    query, key = (torch.randn(rows, tokens, heads, k_dim, generator=gen) for _ in range(2))
    value = torch.randn(rows, tokens, heads, v_dim, generator=gen)
    real = (torch.arange(tokens)[None, :] < torch.tensor([70, 50, 3])[:, None])[..., None]
    g, beta = -torch.rand(rows, tokens, heads, generator=gen) * real, torch.rand(rows, tokens, heads, generator=gen) * real
    initial = torch.randn(rows, heads, k_dim, v_dim, generator=gen)
    want, want_state = torch_chunk_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=initial.clone(),
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    state = initial.clone()
    got = recurrent_steps.gated_delta_steps(query, key, value, g, beta, state)
    assert got.shape == want.shape == (rows, tokens, heads, v_dim)
    assert (got - want).abs().max().item() <= 1e-5 and (state - want_state).abs().max().item() <= 1e-5
    assert (state - initial).abs().max().item() > 0.1


def test_the_prefill_cost_model_loops_for_many_short_prompts_and_chunks_few_long_ones():
    assert recurrent_steps.stepwise_is_cheaper(64, 56) and recurrent_steps.stepwise_is_cheaper(16, 128)
    assert not recurrent_steps.stepwise_is_cheaper(1, 512) and not recurrent_steps.stepwise_is_cheaper(1, 64)


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text"])
def test_both_prefill_paths_of_the_gated_delta_rule_give_the_same_generation(family, tiny_family_dir, tiny_prompts,
                                                                            monkeypatch):
    """Greedy tokens and logprobs are the same whether prefill runs the token loop or the chunks (fp32)."""
    results = {}
    for loop in (True, False):
        monkeypatch.setattr(recurrent_steps, "stepwise_is_cheaper", lambda rows, tokens, loop=loop: loop)
        engine = NativeEngine(tiny_family_dir(family), max_batch_size=8, max_seq_len=64)
        results[loop] = engine.generate(tiny_prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
        engine.shutdown()
    for by_loop, by_chunks in zip(results[True], results[False], strict=True):
        assert by_loop[0].token_ids == by_chunks[0].token_ids
        assert max(abs(a - b) for a, b in zip(by_loop[0].logprobs, by_chunks[0].logprobs, strict=True)) <= 1e-5


def test_mamba2_step_equals_transformers_selective_state_update_over_several_steps():
    """5 rows, 4 heads of dim 6 in 2 groups, state size 8, 6 tokens from a random state: the same outputs
    and states as transformers' single-step Mamba-2 update (given the engine's clamped step)."""
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_selective_state_update

    gen = torch.Generator().manual_seed(0)
    rows, heads, head_dim, groups, size = 5, 4, 6, 2, 8
    state = torch.randn(rows, heads, head_dim, size, generator=gen)
    theirs, ours = state.clone(), state.clone()
    a, d = -torch.rand(heads, generator=gen) * 3, torch.randn(heads, generator=gen)
    for _ in range(6):
        x = torch.randn(rows, heads, head_dim, generator=gen)
        dt = torch.rand(rows, heads, generator=gen)
        b, c = (torch.randn(rows, groups, size, generator=gen) for _ in range(2))
        want = mamba2_selective_state_update(theirs, x, dt[..., None].expand(-1, -1, head_dim),
                                             a[:, None, None].expand(-1, head_dim, size), b, c,
                                             d[:, None].expand(-1, head_dim))
        got = recurrent_steps.mamba2_step(x, dt, a, b, c, d, ours)
        assert got.shape == want.shape == (rows, heads, head_dim)
        assert (got - want).abs().max().item() <= 1e-5
        assert (ours - theirs).abs().max().item() <= 1e-5
    assert ours.abs().max().item() > 0.1


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_moe", "nemotron_h"])
def test_the_engine_decodes_through_its_own_paths(family, tiny_family_dir, tiny_prompts, monkeypatch):
    """Prompts of mixed lengths (40, 1, 27, 4, 7 tokens), several decode steps: every decode step of a
    gated delta-net / Mamba-2 layer runs the engine's update (never transformers' single-step one),
    and every experts module runs the engine's dispatch."""
    calls = []
    for name in ("gated_delta_step", "mamba2_step"):
        step = getattr(recurrent_steps, name)
        monkeypatch.setattr(recurrent_steps, name, lambda *a, step=step: calls.append(a[0].shape[0]) or step(*a))
    engine = NativeEngine(tiny_family_dir(family), max_batch_size=8, max_seq_len=64)
    recurrent_kinds = layers.GATED_DELTA_NETS | layers.MAMBA2_MIXERS
    mixers = [m for m in engine.model.modules() if type(m).__name__ in recurrent_kinds]
    for module in {sys.modules[type(m).__module__] for m in mixers}:  # transformers' single-step updates
        monkeypatch.setattr(module, "torch_recurrent_gated_delta_rule", None, raising=False)  # raise if called
        monkeypatch.setattr(module, "mamba2_selective_state_update", None, raising=False)
    engine.generate(tiny_prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert len(calls) % max(len(mixers), 1) == 0 and (len(calls) >= len(mixers) > 0 or not mixers)
    assert max(calls, default=0) == (len(tiny_prompts) if mixers else 0)  # all rows in one step
    experts = experts_modules(engine.model)
    assert all(m.forward.__func__ is moe.experts_forward for m in experts)
    assert bool(experts) == (family != "qwen3_5_text")


def test_bfloat16_decode_attention_on_cpu_is_the_float32_softmax_over_the_cache(monkeypatch):
    """A bfloat16 cache on CPU: one decode step of 5 rows at different positions (3 query heads per kv head)
    runs the grouped matmuls with float32 scores and softmax, never CPU SDPA (4-6x slower there in bf16),
    and equals the float32 attention over each row's own positions, its new key and value written first."""
    rows, kv_heads, group, dim, max_len = 5, 2, 3, 32, 24
    layer = AttentionKV(rows, max_len, kv_heads, dim, torch.bfloat16, torch.device("cpu"))
    cache = EngineCache([layer], rows, max_len, torch.bfloat16)
    positions = torch.tensor([19, 5, 12, 0, 19])
    step = DecodeStep(cache, positions)
    assert step.float_bias
    gen = torch.Generator().manual_seed(0)
    for name in ("keys", "values"):  # earlier tokens of every row; a row reads only positions <= its own
        layer[name][:, :, :20] = torch.randn(rows, kv_heads, 20, dim, generator=gen).bfloat16()
    query = torch.randn(rows, kv_heads * group, 1, dim, generator=gen).bfloat16()
    key, value = (torch.randn(rows, kv_heads, 1, dim, generator=gen).bfloat16() for _ in range(2))

    def no_sdpa(*args, **kwargs):
        raise AssertionError("CPU SDPA in a bfloat16 decode step")

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", no_sdpa)
    got = attention.decode_attention(step, layer, query, key, value, dim ** -0.5, None)  # [R, 1, H, D]
    assert got.shape == (rows, 1, kv_heads * group, dim) and got.dtype == torch.bfloat16
    for row, position in enumerate(positions.tolist()):
        keys = layer["keys"][row, :, : position + 1].float()  # [kv_heads, p + 1, D], the new key included
        values = layer["values"][row, :, : position + 1].float()
        assert torch.equal(keys[:, -1], key[row, :, 0].float()) and torch.equal(values[:, -1], value[row, :, 0].float())
        heads = query[row, :, 0].float().view(kv_heads, group, dim)
        weights = torch.softmax(heads @ keys.transpose(1, 2) * dim ** -0.5, dim=-1)  # [kv_heads, group, p + 1]
        want = (weights @ values).reshape(kv_heads * group, dim)
        # bf16 rounding of the weights before the value product and of the output: within 2 bf16 ulps
        assert (got[row, 0].float() - want).abs().max().item() <= 2 ** -6 * max(want.abs().max().item(), 1.0)


def test_bfloat16_key_scores_on_cpu_never_transpose_the_cached_keys():
    """A decode step's ``queries @ keys^T`` over a slice of a bfloat16 key cache on CPU: the same
    values as the direct product, bitwise, and no transposed copy of the key slice (CPU's bfloat16
    batched matmul copied the slice to a contiguous ``[..., D, L]`` tensor every layer and step, ~4x the
    cost of the plain copy of rows it makes of the keys untransposed)."""
    rows, kv_heads, group, dim, max_len, length = 8, 2, 3, 32, 64, 40
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(rows, kv_heads, max_len, dim, generator=gen).bfloat16()
    queries = torch.randn(rows, kv_heads, group, dim, generator=gen).bfloat16()
    keys = cache[:, :, :length]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        got = attention.key_scores(queries, keys)
    copied = [event.input_shapes[0] for event in prof.events() if event.name == "aten::copy_"]
    assert not [shape for shape in copied if shape[-2:] == [dim, length]], copied
    assert got.shape == (rows, kv_heads, group, length)
    assert torch.equal(got, torch.matmul(queries, keys.transpose(-1, -2)))


class _DepthwiseMixer(torch.nn.Module):
    """What ``recurrent.convolve`` reads of a gated delta-net / Mamba-2 mixer: a depthwise ``conv1d`` and its
    activation."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.conv1d = torch.nn.Conv1d(channels, channels, kernel, groups=channels, bias=True)
        self.activation = "silu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_convolves_from_channel_last_states(dtype):
    """The recurrent layers' convolution state is held channels last ([rows, kernel - 1, C]), so that a decode
    step's window is ``kernel`` contiguous [R, C] slices summed over its middle axis. Over three decode steps of
    5 of 8 rows: each output is the depthwise conv1d (with bias and SiLU) of the row's last ``kernel`` inputs,
    and the state holds its last ``kernel - 1`` inputs, channels last; the other rows are untouched."""
    from rl_backends_gen.native import recurrent
    from rl_backends_gen.native.cache import RecurrentState

    gen = torch.Generator().manual_seed(0)
    rows, channels, kernel, active = 8, 96, 4, 5
    mixer = _DepthwiseMixer(channels, kernel).to(dtype)
    with torch.no_grad():
        mixer.conv1d.weight.copy_(torch.randn(channels, 1, kernel, generator=gen))
        mixer.conv1d.bias.copy_(torch.randn(channels, generator=gen))
    layer = RecurrentState(rows, channels, kernel, (2, 4, 4), dtype, torch.float32, torch.device("cpu"))
    cache = EngineCache([layer], rows, 16, dtype)
    assert layer["conv"].shape == (rows, kernel - 1, channels)
    history = torch.randn(rows, channels, kernel - 1, generator=gen).to(dtype)  # each row's last inputs
    layer["conv"].copy_(history.transpose(1, 2))
    untouched = layer["conv"][active:].clone()
    step = DecodeStep(cache, torch.full((active,), 3))
    for _ in range(3):
        inputs = torch.randn(active, channels, 1, generator=gen).to(dtype)
        out = recurrent.convolve(mixer, inputs, step, layer)
        window = torch.cat([history[:active], inputs], dim=-1).float()  # [R, C, kernel]
        want = torch.nn.functional.silu(torch.nn.functional.conv1d(
            window, mixer.conv1d.weight.float(), mixer.conv1d.bias.float(), groups=channels))
        assert out.shape == (active, channels, 1) and out.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 0.05  # bfloat16: products and sum rounded to 8 bits
        assert (out.float() - want).abs().max().item() <= tolerance
        history = torch.cat([history[:active], inputs], dim=-1)[..., 1:]
        assert torch.equal(layer["conv"][:active], history.transpose(1, 2))
    assert torch.equal(layer["conv"][active:], untouched)
