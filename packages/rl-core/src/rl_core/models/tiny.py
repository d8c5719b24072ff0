"""Tiny HF models and tokenizers built offline, for tests and smoke recipes.

Nothing here touches a hub: the tokenizer is a byte-level BPE trained in a fraction of a second on a
fixed procedural corpus, and the models are randomly initialised from a config (seeded).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]

_WORDS = (
    "the answer is what of and to a in that it for you was on are with as be this have from or "
    "one had by word but not all were we when your can said there use an each which she do how "
    "their if will up other about out many then them these so some her would make like him into "
    "time has look two more write go see number no way could people my than first water been call "
    "who oil its now find long down day did get come made may part sum plus minus times equals "
    "solve compute add multiply subtract final box boxed think step move left right up down board "
    "tile puzzle solved python code print def return tool calculator result error user assistant "
    "system question please reasoning correct wrong"
).split()


def _corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        out.append(f"What is {a} {op} {b}? {words}. The answer is \\boxed{{{a + b}}}.")
    return out


def build_tiny_tokenizer(vocab_size: int = 512, seed: int = 0, variant: str = "bpe"):
    """A ``PreTrainedTokenizerFast`` with a ChatML chat template.

    ``variant="bpe"`` is a byte-level BPE; ``variant="char"`` is byte-level with no merges beyond
    the alphabet (a tokenizer that really differs from the BPE one, for cross-tokenizer tests).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    size = len(alphabet) + len(SPECIAL_TOKENS) if variant == "char" else vocab_size
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# Every tiny model: ~100-300k parameters, head_dim 32 (vLLM's CPU kernels need >= 32), fp32.
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=None,
    dtype="float32",
)
_OMIT = object()  # a common key the family's config does not take
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=64)
_GATED_DELTA = dict(  # Qwen3.5: gated delta-net linear attention, then full attention, then linear again
    num_hidden_layers=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    initializer_range=0.05,  # at the default 0.02 the recurrent state barely reaches the logits
)

# HF ``model_type`` -> config keys over ``_COMMON``: the smallest model that still has every layer
# kind of the family (sliding + global, linear + full attention, dense + sparse MLP, ...).
FAMILIES: dict[str, dict] = {
    "llama": {},
    "qwen2": {"head_dim": _OMIT},
    "mixtral": {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3": {},
    "qwen3_moe": {**_MOE, "num_experts": 4, "norm_topk_prob": True},
    "qwen3_5_text": _GATED_DELTA,
    "qwen3_5_moe_text": {**_GATED_DELTA, **_MOE, "num_experts": 4, "shared_expert_intermediate_size": 64},
    "glm4_moe_lite": {  # multi-head latent attention (q and kv low-rank), a dense then a sparse MLP
        **_MOE, "num_key_value_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32, "v_head_dim": 32, "mlp_layer_types": ["dense", "sparse"],
        "n_routed_experts": 4, "n_shared_experts": 1, "head_dim": _OMIT,
    },
    "nemotron_h": {  # Mamba-2, MoE, attention and MLP blocks (one mixer per block)
        **_MOE, "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"],
        "num_hidden_layers": _OMIT, "mamba_num_heads": 4, "mamba_head_dim": 32, "n_groups": 2,
        "ssm_state_size": 16, "conv_kernel": 4, "chunk_size": 8, "n_routed_experts": 4,
        "moe_shared_expert_intermediate_size": 64, "layer_norm_epsilon": 1e-6, "rms_norm_eps": _OMIT,
        "initializer_range": 0.1,  # at 0.02 the Mamba state barely reaches the logits
    },
    "gemma3_text": {  # window 8: the test prompts (up to ~20 tokens) reach past it
        "num_hidden_layers": 3, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 8, "query_pre_attn_scalar": 32,
    },
    "gpt_oss": {  # sliding + full attention with attention sinks, a mixture of 4 experts
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8, "intermediate_size": 64,
        "num_local_experts": 4, "num_experts_per_tok": 2,
        "rope_parameters": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "truncate": False, "original_max_position_embeddings": 64, "rope_theta": 150000.0},
    },
}


def tiny_model_config(tokenizer, family: str = "llama", **overrides):
    """Config of a tiny ``family`` model (an HF ``model_type`` listed in ``FAMILIES``)."""
    from transformers import AutoConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; use one of {sorted(FAMILIES)}")
    special = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    kwargs = {k: v for k, v in (_COMMON | special | FAMILIES[family] | overrides).items() if v is not _OMIT}
    return AutoConfig.for_model(family, **kwargs)


def build_tiny_model(tokenizer, family: str = "llama", seed: int = 0, **overrides):
    """A randomly initialised causal LM (seeded, fp32, eval mode)."""
    from transformers import AutoModelForCausalLM

    config = tiny_model_config(tokenizer, family, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def save_tiny_model(path: str | Path, family: str = "llama", seed: int = 0, vocab_size: int = 512,
                    tokenizer_variant: str = "bpe", **overrides) -> Path:
    """Build a tiny model + tokenizer and save them as an HF directory (safetensors). Returns the path."""
    path = Path(path)
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, seed=seed, variant=tokenizer_variant)
    model = build_tiny_model(tokenizer, family=family, seed=seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
