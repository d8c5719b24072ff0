"""The native engine's newer paths on CUDA (skipped without a GPU; scripts/gpu_check.sh runs them): every model
family of ``rl_core.models.tiny`` against HF on the same GPU, speculative decoding and its online draft, prompts with images,
the MoE routing record, and decode steps replayed as CUDA graphs against eager ones. The CPU tests of each feature hold
the same claims at fp32 on the CPU."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.config import SpeculativeConfig
from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_core.models.moe import moe_routers
from rl_core.models.tiny import FAMILIES
from rl_core.types import SamplingParams

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


def tokens(results):
    return [[c.token_ids for c in samples] for samples in results]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_greedy_and_logprobs_equal_hf_on_the_gpu(family, tiny_family_dir, tiny_prompts):
    path = tiny_family_dir(family)
    engine = NativeEngine(path, device=DEVICE, max_batch_size=8, max_seq_len=128)
    got = engine.generate(tiny_prompts, GREEDY)
    want = HFGenerationBackend(path, device=DEVICE, batch_size=1).generate(tiny_prompts, GREEDY)
    assert tokens(got) == tokens(want), family
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g[0].logprobs, w[0].logprobs)) <= 1e-4
    engine.shutdown()


@pytest.mark.parametrize("speculative", [
    SpeculativeConfig(method="ngram", num_tokens=3, ngram={"min_n": 1, "max_n": 3}),
    SpeculativeConfig(method="draft", num_tokens=3, draft_model="policy_layers:1"),
    SpeculativeConfig(method="draft", num_tokens=3, draft_model="policy_layers:1", draft_vocab_size=64),
], ids=["ngram", "draft", "draft-vocab"])
def test_speculative_greedy_is_plain_greedy_on_the_gpu(speculative, tiny_model_dir, tiny_prompts, tiny_tokenizer):
    prompts = tiny_prompts + [tiny_tokenizer.encode("1 2 3 1 2 3 1 2 3 1 2")]
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    plain = NativeEngine(tiny_model_dir, device=DEVICE, max_batch_size=3, max_seq_len=128)
    expected = plain.generate(prompts * 2, greedy)
    engine = NativeEngine(tiny_model_dir, device=DEVICE, max_batch_size=3, max_seq_len=128, speculative=speculative)
    got = engine.generate(prompts * 2, greedy)
    assert tokens(got) == tokens(expected)
    assert max(abs(a - b) for g, w in zip(got, expected) for a, b in zip(g[0].logprobs, w[0].logprobs)) <= 1e-4
    assert engine.speculative.last_call.proposed_tokens > 0
    plain.shutdown()
    engine.shutdown()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_prompts_with_images_equal_hf_generate_on_the_gpu(family, tiny_vlm_dir):
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor
    from rl_core.vision_inputs import encode_chat

    path = tiny_vlm_dir(family)
    processor = load_processor(path)
    chats = [[{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", size, colour)},
                                           {"type": "text", "text": "colour?"}]}]
             for size, colour in (((32, 32), (255, 0, 0)), ((40, 24), (0, 0, 255)))]
    prompts = [encode_chat(processor, chat, add_generation_prompt=True) for chat in chats]
    engine = NativeEngine(path, device=DEVICE, max_batch_size=4, max_seq_len=256)
    got = [r[0].token_ids for r in engine.generate(prompts, GREEDY)]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()
    for prompt, generated in zip(prompts, got):
        inputs = {"input_ids": torch.tensor([prompt.input_ids]), **prompt.image_inputs}
        if prompt.mm_token_type_ids is not None:
            inputs["mm_token_type_ids"] = torch.tensor([prompt.mm_token_type_ids])
        inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        out = model.generate(**inputs, max_new_tokens=GREEDY.max_new_tokens, do_sample=False)
        assert generated == out[0, len(prompt.input_ids):].tolist()[: len(generated)], family
    engine.shutdown()


def test_moe_routing_record_is_a_plain_forwards_experts_on_the_gpu(tiny_family_dir, tiny_prompts):
    from transformers import AutoModelForCausalLM

    path = tiny_family_dir("qwen3_moe")
    engine = NativeEngine(path, device=DEVICE, max_batch_size=4, max_seq_len=128, record_routing=True)
    results = engine.generate(tiny_prompts, SamplingParams(max_new_tokens=12, temperature=1.0, n=2, seed=3))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()
    chosen = []
    for router in moe_routers(model):
        router.register_forward_hook(lambda _m, _a, out: chosen.append(out[2]))
    for prompt, samples in zip(tiny_prompts, results):
        for completion in samples:
            ran = prompt + completion.token_ids[:-1]  # the last generated token never ran
            chosen.clear()
            with torch.no_grad():
                model(input_ids=torch.tensor([ran], device=DEVICE))
            expected = torch.stack(chosen, dim=1).sort(-1).values.cpu()
            assert torch.equal(completion.routed_experts.long().sort(-1).values, expected)
    engine.shutdown()


def test_online_draft_trains_on_the_gpu_and_greedy_stays_plain(tiny_model_dir, tiny_prompts):
    """generation.speculative.train_draft on CUDA: the draft's own layers train (its loss falls), the policy's
    weights do not move, and speculative greedy is still plain greedy."""
    from rl_algorithms.draft import train_draft

    spec = SpeculativeConfig(method="draft", num_tokens=3, draft_model="policy_layers:1", train_draft=True,
                             draft_lr=3e-3, draft_steps=4, draft_top_k=512)
    engine = NativeEngine(tiny_model_dir, device=DEVICE, max_batch_size=4, max_seq_len=128, speculative=spec)
    policy_before = [p.detach().clone() for p in engine.model.parameters()]
    results = engine.generate(tiny_prompts, SamplingParams(max_new_tokens=16, temperature=1.0, n=2, seed=1))
    rows = [p + c.token_ids for p, samples in zip(tiny_prompts, results) for c in samples]
    length = max(map(len, rows))
    batch = {"input_ids": torch.zeros(len(rows), length, dtype=torch.long),
             "attention_mask": torch.zeros(len(rows), length, dtype=torch.long), "loss_mask": torch.zeros(len(rows), length)}
    for row, (prompt, samples) in enumerate((p, c) for p, s in zip(tiny_prompts, results) for c in s):
        full = prompt + samples.token_ids
        batch["input_ids"][row, : len(full)] = torch.tensor(full)
        batch["attention_mask"][row, : len(full)] = 1
        batch["loss_mask"][row, len(prompt): len(full)] = 1.0
    metrics = train_draft(engine, batch)
    assert metrics["draft/distill_loss_last"] < metrics["draft/distill_loss"]
    assert all(torch.equal(a, b) for a, b in zip(policy_before, engine.model.parameters()))
    engine.sleep()  # the draft's own layers and AdamW moments leave the GPU with the policy
    assert all(p.device.type == "cpu" for p in engine.speculative.trainer.parameters)
    engine.wake()
    assert all(p.device.type == "cuda" for p in engine.speculative.trainer.parameters)
    plain = NativeEngine(tiny_model_dir, device=DEVICE, max_batch_size=4, max_seq_len=128)
    assert tokens(engine.generate(tiny_prompts, GREEDY)) == tokens(plain.generate(tiny_prompts, GREEDY))
    plain.shutdown()
    engine.shutdown()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_graphs_equal_eager_steps_on_the_gpu(dtype, tiny_model_dir, tiny_prompts, load_hf_model):
    """decode_graphs="auto" captures the decode step as CUDA graphs and replays them: greedy tokens equal
    the eager engine's, logprobs close; sleep drops the graphs and wake recaptures; a refit reaches the
    graphs already captured."""
    # A stop id never produced: every row runs to its limit, so the buckets do not depend on the weights.
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=(10**6,))
    prompts = tiny_prompts * 3  # 12 requests through 5 rows: rows join and leave, row buckets 1, 2, 4, 5
    eager = NativeEngine(tiny_model_dir, device=DEVICE, dtype=dtype, max_batch_size=5, max_seq_len=300,
                         decode_graphs="off")
    engine = NativeEngine(tiny_model_dir, device=DEVICE, dtype=dtype, max_batch_size=5, max_seq_len=300)
    engine.decode_graphs.length_step = 16  # several key-length buckets within 24 new tokens
    tolerance = 1e-4 if dtype == "float32" else 0.05

    def assert_equal_to_eager(got, sampling):
        want = eager.generate(prompts, sampling)
        assert tokens(got) == tokens(want)
        assert max(abs(a - b) for g, w in zip(got, want) for cg, cw in zip(g, w)
                   for a, b in zip(cg.logprobs, cw.logprobs)) <= tolerance

    before = engine.generate(prompts, greedy)
    assert_equal_to_eager(before, greedy)
    stats = engine.stats
    assert stats.graph_captures >= 4 and stats.graph_replays == stats.decode_steps == eager.stats.decode_steps
    if dtype == "float32":
        sampled = SamplingParams(max_new_tokens=24, temperature=1.0, n=2, seed=3)
        assert_equal_to_eager(engine.generate(prompts, sampled), sampled)
    allocated = []
    for _ in range(2):  # colocated GRPO sleeps and wakes every step: recapturing must not grow memory
        engine.sleep()
        assert not engine.decode_graphs.graphs
        engine.wake()
        captures = stats.graph_captures
        assert tokens(engine.generate(prompts, greedy)) == tokens(before) and stats.graph_captures > captures
        allocated.append(torch.cuda.memory_allocated())
    assert allocated[1] == allocated[0]  # (a fresh warm-up stream per capture leaked cuBLAS's 32 MiB workspace)
    weights = {name: p.detach().to(DEVICE) * 1.5 for name, p in load_hf_model(tiny_model_dir).named_parameters()}
    for each in (eager, engine):
        each.update_weights(weights.items())
    captures, replays = stats.graph_captures, stats.graph_replays
    after = engine.generate(prompts, greedy)
    assert tokens(after) != tokens(before)
    assert_equal_to_eager(after, greedy)
    assert stats.graph_captures == captures and stats.graph_replays > replays  # the same graphs, new weights
    eager.shutdown()
    engine.shutdown()
