"""gen-gpu: generation tokens/s of the native engine (decode steps as CUDA graphs, and eager) vs HF generate
on one CUDA GPU, same prompts, one run.

    python bench/gen_gpu.py                          # SmolLM2-135M-shaped model, bf16, batch 64 and 256
    python bench/gen_gpu.py --shape qwen2.5-0.5b --batch-sizes 64  # a Qwen2.5-0.5B-shaped model
    python bench/gen_gpu.py --model smollm2-135m-instruct --dtype float32

A device machine cannot download models, so by default the model is SmolLM2-135M's architecture
with random weights (the same matmuls, attention and vocabulary: the same speed; ``--shape``
qwen2.5-0.5b: Qwen2.5-0.5B's) and a small
tokenizer that is only used to decode text. Prompts: 49 tokens,
the first 27 shared (like the chat-template prompts of gen-cpu); temperature 1.0 and a stop id that
is never produced, so every engine generates exactly batch x new_tokens tokens. Engines (native-graphs:
``decode_graphs="auto"``, native-eager: ``"off"``, hf) run interleaved; the best round is shown.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

SHAPES = {  # random weights of these architectures (a device machine downloads nothing)
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                   rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
}


def random_model(directory: str, shape: str) -> str:
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    from rl_core.models import build_tiny_tokenizer

    family, kwargs = SHAPES[shape]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(CONFIG_MAPPING[family](**kwargs)).save_pretrained(directory)
    build_tiny_tokenizer().save_pretrained(directory)  # only decodes text; ids it lacks decode to nothing
    return directory


def make_prompts(batch: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    shared = torch.randint(100, vocab, (27,), generator=generator).tolist()
    return [shared + torch.randint(100, vocab, (22,), generator=generator).tolist() for _ in range(batch)]


def main() -> int:
    from rl_backends_gen.hf import HFGenerationBackend
    from rl_backends_gen.native import NativeEngine
    from rl_core.types import SamplingParams

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model name or HF directory (default: random weights of --shape)")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES),
                        help="the architecture of the random model when --model is not given")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gen_gpu.py needs a CUDA GPU")
    if args.model is None:
        model_path = random_model(tempfile.mkdtemp(prefix="gen-gpu-"), args.shape)
    else:
        from rl_core.models import resolve_model

        model_path = resolve_model(args.model)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0, stop_token_ids=(10**9 % 7919,))
    print(f"# gen-gpu  {torch.cuda.get_device_name()}  {args.model or args.shape}  dtype={args.dtype}  new_tokens={args.new_tokens}  "
          f"torch {torch.__version__}")
    warmup = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)
    for batch in args.batch_sizes:
        prompts = make_prompts(batch, 49152)  # ids every shape's vocabulary has
        engines = {f"native-{mode}": NativeEngine(model_path, dtype=args.dtype, device="cuda", max_batch_size=batch,
                                                  max_seq_len=49 + args.new_tokens + 8, decode_graphs=flag)
                   for mode, flag in (("graphs", "auto"), ("eager", "off"))}
        engines["hf"] = HFGenerationBackend(model_path, dtype=args.dtype, device="cuda", batch_size=batch)
        for engine in engines.values():
            engine.generate(prompts[:4], warmup)
        # The first full-batch call of the graphs engine also captures its graphs: the best round is shown.
        best = dict.fromkeys(engines, 0.0)
        for _ in range(args.repeats):
            for name, engine in engines.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = engine.generate(prompts, sampling)
                torch.cuda.synchronize()
                tokens = sum(len(c.token_ids) for r in out for c in r)
                best[name] = max(best[name], tokens / (time.perf_counter() - start))
        graphs = engines["native-graphs"]
        print(f"batch {batch:4d}  " + "  ".join(f"{name} {rate:9.1f} tok/s" for name, rate in best.items())
              + "  " + "  ".join(f"{name}/hf = {best[name] / best['hf']:.2f}x" for name in best if name != "hf")
              + f"  (graphs captured {graphs.stats.graph_captures}, replays {graphs.stats.graph_replays})", flush=True)
        for engine in engines.values():
            if isinstance(engine, NativeEngine):
                engine.shutdown()
        del engines, graphs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
