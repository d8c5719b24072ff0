"""families-profile: where a decode step of the native engine goes, per module kind, on the SmolLM2-sized
models of bench/families_gen.py (batch 64, fp32 or bfloat16).

    python bench/families_profile.py                       # both families, 16 new tokens, 1 thread
    python bench/families_profile.py --families qwen3_moe --threads 2
    python bench/families_profile.py --families qwen3_5_text --threads 2 --dtype bfloat16
    python bench/families_profile.py --families qwen3_moe --prompts random   # tokens spread over every expert
    python bench/families_profile.py --tiny                # the tiny models, batch 4: a check that it runs
    python bench/families_profile.py --kernels             # one layer's reference vs engine kernels, A/B

The prompts are families-gen's (``--prompts``: gen-cpu's chat prompts by default, or random ids): a random
MoE's router sends the chat prompts' 64 rows to 2-4 experts a layer, random ids to all 8.

Forward hooks time every decoder layer and the modules inside it (attention, gated delta-net, MoE
block, experts, router, MLP, norms) and every ``Linear`` (the LM head included: their sum is the step's
matrix products); only decode forwards (one token per row) count. The engine runs its decode steps
through transformers' forward here (``direct_decode=False``), whose module calls the hooks time. Nested
modules overlap (a MoE block contains its experts and router, a layer its linears): read each line as that
module's share. The first
line, ``decoder (no LM head)``, is the decoder's whole forward (embedding to final norm, hooks included);
the LM head is one of the linears.

``--kernels`` times, interleaved in one process (best of 15 rounds), one layer's decode kernels at the
benchmark's sizes (64 rows): transformers' experts forward (its default ``grouped_mm`` and ``eager``)
against the engine's dispatch (``native/moe.py``), and transformers' single-step gated delta rule
(plus the engine's old copy back into its cache) against ``native/recurrent_steps.py``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from families_gen import PROMPTS, SIZES, build, make_family_prompts, sampling_params  # noqa: E402

TIMED = ("DecoderLayer", "Attention", "GatedDeltaNet", "SparseMoeBlock", "Experts", "TopKRouter", "MLP", "RMSNorm",
         "Linear")


def time_modules(model: torch.nn.Module, rows: int, named: dict[str, torch.nn.Module]) -> dict[str, list[float]]:
    """Hooks on ``model``'s timed modules and on the ``named`` ones: ``{kind or name: [seconds of each
    decode call]}``."""
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    kinds = [(type(module).__name__, module) for module in model.modules()
             if any(part in type(module).__name__ for part in TIMED)]
    for kind, module in kinds + list(named.items()):

        def start(mod, _args, _kwargs):
            mod._profile_start = time.perf_counter()

        def stop(mod, args, kwargs, _out, kind=kind):
            if is_decode(args[0] if args else next(iter(kwargs.values())), rows):
                seconds[kind].append(time.perf_counter() - mod._profile_start)

        module.register_forward_pre_hook(start, with_kwargs=True)
        module.register_forward_hook(stop, with_kwargs=True)
    return seconds


def is_decode(inputs: torch.Tensor, rows: int) -> bool:
    """Whether a module's first input is a decode forward's over all ``rows``: token ids ``[rows, 1]`` (the
    decoder's; a prefill's ``[rows, L]`` is not), or hidden states ``[rows, 1, hidden]`` / flattened ``[rows, hidden]``."""
    if not inputs.is_floating_point():
        return tuple(inputs.shape) == (rows, 1)
    return inputs.shape[:-1] in ((rows, 1), (rows,))


def profile(family: str, args) -> dict[str, float]:
    """``{module kind: ms per decode step}`` of ``family``'s model, printed as a table."""
    from transformers import AutoTokenizer

    from rl_backends_gen.native import NativeEngine

    with tempfile.TemporaryDirectory() as folder:
        path = build(family, args.tiny, folder)
        # families-gen's prompts: the MoE's routing (how many experts a layer's rows reach) depends on them
        prompts = make_family_prompts(args.prompts, AutoTokenizer.from_pretrained(path), args.batch, args.tiny)
        # Through transformers' forward (direct_decode=False): the hooks time its module calls, which the engine's
        # own decode forward (native/direct.py, the MoE's default on CPU) does not make per layer.
        engine = NativeEngine(path, dtype=args.dtype, max_batch_size=args.batch,
                              max_seq_len=max(map(len, prompts)) + args.new_tokens + 8, direct_decode=False)
        engine.generate(prompts[:2], sampling_params(4))  # warm-up
        seconds = time_modules(engine.model, args.batch, {"decoder (no LM head)": engine.decoder})
        start = time.perf_counter()
        engine.generate(prompts, sampling_params(args.new_tokens))
        total = time.perf_counter() - start
        layers = engine.model.config.num_hidden_layers
        engine.shutdown()
    layer_calls = sum(len(times) for kind, times in seconds.items() if kind.endswith("DecoderLayer"))
    steps = max(layer_calls // layers, 1)  # decode forwards timed
    print(f"# {family} {args.dtype}, {args.prompts} prompts: {args.new_tokens} tokens x {args.batch} rows in {total:.1f} s, "
          f"{steps} decode steps timed, "
          f"threads={torch.get_num_threads()}, load average={os.getloadavg()[0]:.1f}")
    for kind, times in sorted(seconds.items(), key=lambda item: -sum(item[1])):
        print(f"{kind:>28} {sum(times) * 1000 / steps:8.1f} ms/step  ({len(times) // steps} calls/step)")
    return {kind: sum(times) * 1000 / steps for kind, times in seconds.items()}


def kernels(rows: int, rounds: int = 15) -> dict[str, float]:
    """``{kernel: best ms per call}`` of one layer, reference and engine interleaved."""
    import copy

    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from rl_backends_gen.native import moe, recurrent_steps

    size = SIZES["qwen3_moe"]
    config = AutoConfig.for_model("qwen3_moe", hidden_size=size["hidden_size"], num_experts=size["num_experts"],
                                  num_experts_per_tok=size["num_experts_per_tok"],
                                  moe_intermediate_size=size["moe_intermediate_size"])
    gen = torch.Generator().manual_seed(0)
    experts = {}
    for name in ("grouped_mm", "eager"):
        config._experts_implementation = name
        experts[f"experts {name}"] = Qwen3MoeExperts(copy.deepcopy(config))
    for module in experts.values():
        with torch.no_grad():
            for weight in module.parameters():
                weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
    experts["experts engine"] = copy.deepcopy(experts["experts eager"])
    moe.install(experts["experts engine"])
    k = size["num_experts_per_tok"]
    tokens = torch.randn(rows, size["hidden_size"], generator=gen)
    chosen = torch.stack([torch.randperm(size["num_experts"], generator=gen)[:k] for _ in range(rows)])
    weights = torch.rand(rows, k, generator=gen)

    hybrid = SIZES["qwen3_5_text"]
    heads, k_dim, v_dim = hybrid["linear_num_value_heads"], hybrid["linear_key_head_dim"], hybrid["linear_value_head_dim"]
    query, key = (torch.randn(rows, 1, heads, k_dim, generator=gen) for _ in range(2))
    value = torch.randn(rows, 1, heads, v_dim, generator=gen)
    g, beta = -torch.rand(rows, 1, heads, generator=gen), torch.rand(rows, 1, heads, generator=gen)
    state = torch.randn(rows, heads, k_dim, v_dim, generator=gen) * 0.1

    def reference_rule():
        _, new = torch_recurrent_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=state,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
        state.copy_(new)

    calls = {name: (lambda m=m: m(tokens, chosen, weights)) for name, m in experts.items()}
    calls["delta rule transformers"] = reference_rule
    calls["delta rule engine"] = lambda: recurrent_steps.gated_delta_step(query, key, value, g, beta, state)
    best = {name: float("inf") for name in calls}
    with torch.no_grad():
        for _ in range(rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                best[name] = min(best[name], time.perf_counter() - start)
    print(f"# one layer's decode kernels, {rows} rows, threads={torch.get_num_threads()}, "
          f"load average={os.getloadavg()[0]:.1f} (best of {rounds})")
    for name, seconds in best.items():
        print(f"{name:>28} {seconds * 1000:8.2f} ms")
    return {name: seconds * 1000 for name, seconds in best.items()}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=sorted(SIZES), choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=None, help="rows (default 64; 4 with --tiny)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tiny", action="store_true", help="rl_core.models.tiny's models, batch 4: a quick check")
    parser.add_argument("--kernels", action="store_true", help="time one layer's kernels, reference vs engine")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--prompts", default="chat", choices=PROMPTS,
                        help="families-gen's prompts (chat: gen-cpu's, the benchmark's; random: random ids, which "
                        "spread the MoE's tokens over all its experts where the chat prompts reach 2-4 a layer)")
    args = parser.parse_args(argv)
    args.batch = args.batch or (4 if args.tiny else 64)
    torch.set_num_threads(args.threads)
    if args.kernels:
        return {"kernels": kernels(args.batch)}
    return {family: profile(family, args) for family in args.families}


if __name__ == "__main__":
    main()
