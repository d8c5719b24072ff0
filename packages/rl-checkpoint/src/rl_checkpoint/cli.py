"""``rl-checkpoint``: convert, inspect and compare checkpoints. Bad input exits 2 with one line.

Wherever a checkpoint is read, a training run directory means its latest complete checkpoint, and a
checkpoint step directory means its ``policy/``; training checkpoints are verified against their
``manifest.json`` checksums before they are read."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from rl_checkpoint import convert
from rl_checkpoint.detect import FORMATS, checked_lora_alpha, checked_lora_rank, detect_format
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.output import parse_size


def _common_out(p: argparse.ArgumentParser, dtype: bool = True) -> None:
    p.add_argument("out", type=Path, help="output directory (written atomically)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--max-shard-size", default="2GB", help="largest safetensors shard (default 2GB)")
    if dtype:
        p.add_argument("--dtype", choices=sorted(convert.DTYPES), help="cast floating-point tensors")


def _lora_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha, when the checkpoint does not record it")
    p.add_argument("--lora-rank", type=int, help="LoRA rank, when the checkpoint does not record it")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-checkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("dcp-to-hf", help="training checkpoint (or bare DCP dir) -> HF safetensors")
    p.add_argument("path", type=Path, help="run dir (its latest complete checkpoint), checkpoint step dir, its "
                   "policy/ (dcp/ + hf_config/ + meta.json), or a bare DCP dir")
    _common_out(p)
    p.add_argument("--config-dir", type=Path, help="dir with config.json/tokenizer (for a bare DCP dir)")
    _lora_flags(p)

    p = sub.add_parser("hf-to-dcp", help="HF safetensors -> training checkpoint (dcp/ + hf_config/ + meta.json)")
    p.add_argument("path", type=Path, help="HF model directory")
    p.add_argument("out", type=Path)
    p.add_argument("--force", action="store_true")
    p.add_argument("--megatron", action="store_true", help="write megatron-core names (stacked layers)")
    p.add_argument("--layer-spec", choices=["local", "te"], default="local",
                   help="norm weight names for --megatron: local (input_layernorm) or te (fused layer_norm_weight)")

    p = sub.add_parser("megatron-to-hf", help="megatron-core distributed checkpoint (Llama/Qwen2) -> HF")
    p.add_argument("path", type=Path, help="Megatron checkpoint dir (iter_* or its parent)")
    _common_out(p)
    p.add_argument("--config-dir", type=Path, required=False, help="HF config/tokenizer dir of the model")

    p = sub.add_parser("merge-lora", help="base + LoRA adapter -> merged HF (or --adapter-only: PEFT adapter)")
    p.add_argument("adapter", type=Path, help="PEFT adapter dir or a training checkpoint with LoRA tensors")
    _common_out(p, dtype=False)
    p.add_argument("--base", type=Path, help="base model (any supported format)")
    p.add_argument("--adapter-only", action="store_true", help="export the adapter in PEFT format")
    _lora_flags(p)

    p = sub.add_parser("gguf-to-hf", help="GGUF (llama/qwen2) -> dequantised HF safetensors")
    p.add_argument("path", type=Path, help="the .gguf file")
    _common_out(p)
    p.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer files")

    p = sub.add_parser("to-hf", help="any supported checkpoint -> HF (format guessed)")
    p.add_argument("path", type=Path)
    _common_out(p)
    p.add_argument("--format", choices=FORMATS, help="skip guessing")
    p.add_argument("--config-dir", type=Path, help="HF config/tokenizer dir (bare DCP, Megatron)")
    _lora_flags(p)

    p = sub.add_parser("inspect", help="format, tensor names, shapes, dtypes and total size")
    p.add_argument("path", type=Path)
    p.add_argument("--format", choices=FORMATS)
    p.add_argument("--config-dir", type=Path)
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = sub.add_parser("diff", help="max |a - b| per tensor; exit 1 beyond --atol or where NaN/inf differ")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--atol", type=float, default=0.0,
                   help="largest allowed max abs difference, a finite number >= 0 (default 0); a NaN or inf in "
                        "one checkpoint is a difference unless the other has the same at the same position")
    p.add_argument("--config-dir-a", type=Path)
    p.add_argument("--config-dir-b", type=Path)
    return parser


def _run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd in ("dcp-to-hf", "megatron-to-hf", "to-hf"):
        fmt = getattr(args, "format", None)
        if cmd == "dcp-to-hf":
            found = detect_format(args.path)
            if found not in ("rl-dcp", "dcp"):
                raise CheckpointError(f"{args.path}: is a {found} checkpoint, not DCP; use `rl-checkpoint to-hf`")
        if cmd == "megatron-to-hf":
            fmt = "megatron"
        out = convert.to_hf(args.path, args.out, fmt=fmt, config_dir=args.config_dir,
                            dtype=convert.parse_dtype(args.dtype), force=args.force,
                            max_shard_bytes=parse_size(args.max_shard_size),
                            lora_alpha=getattr(args, "lora_alpha", None), lora_rank=getattr(args, "lora_rank", None))
        print(f"wrote {out}")
    elif cmd == "hf-to-dcp":
        print(f"wrote {convert.hf_to_dcp(args.path, args.out, force=args.force, megatron=args.megatron, layer_spec=args.layer_spec)}")
    elif cmd == "merge-lora":
        out = convert.merge_lora(args.adapter, args.out, base=args.base, adapter_only=args.adapter_only,
                                 lora_alpha=args.lora_alpha, lora_rank=args.lora_rank, force=args.force,
                                 max_shard_bytes=parse_size(args.max_shard_size))
        print(f"wrote {out}")
    elif cmd == "gguf-to-hf":
        out = convert.gguf_to_hf(args.path, args.out, dtype=convert.parse_dtype(args.dtype) or convert.DTYPES["fp32"],
                                 force=args.force, max_shard_bytes=parse_size(args.max_shard_size),
                                 tokenizer=not args.no_tokenizer)
        print(f"wrote {out}")
    elif cmd == "inspect":
        report = convert.inspect(args.path, fmt=args.format, config_dir=args.config_dir)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            _print_inspect(report)
    elif cmd == "diff":
        return _print_diff(convert.diff(args.a, args.b, config_dir_a=args.config_dir_a,
                                        config_dir_b=args.config_dir_b), args.atol)
    return 0


def _print_inspect(report: dict) -> None:
    width = max((len(n) for n in report["tensors"]), default=10)
    for name, t in report["tensors"].items():
        print(f"{name:<{width}}  {str(t['shape']):<20} {t['dtype']}")
    print(f"format={report['format']} path={report['path']} tensors={report['num_tensors']} "
          f"parameters={report['num_parameters']:,} size={report['total_bytes'] / 2**20:.1f} MiB")
    if report["checksums"]:
        print(f"checksums: {report['checksums']}")


def _print_diff(report: dict, atol: float) -> int:
    mismatch, in_both = report["nonfinite_mismatch"], report["nonfinite_same"]
    bad = [n for n, d in report["max_abs_diff"].items() if d > atol or n in mismatch]
    for name in bad:
        nan_inf = f", nan_inf_mismatches={mismatch[name]}" if name in mismatch else ""
        print(f"DIFF {name}: max_abs_diff={report['max_abs_diff'][name]:.3e}{nan_inf}")
    for name, count in in_both.items():
        print(f"NAN-INF {name}: {count} NaN/inf at the same positions in both (counted as equal)")
    for name, (sa, sb) in report["shape_mismatch"].items():
        print(f"SHAPE {name}: {sa} vs {sb}")
    for name in report["only_in_a"]:
        print(f"ONLY-A {name}")
    for name in report["only_in_b"]:
        print(f"ONLY-B {name}")
    worst = max(report["max_abs_diff"].values(), default=0.0)
    same = not (bad or report["shape_mismatch"] or report["only_in_a"] or report["only_in_b"])
    counts = "".join(f", {key}={sum(c.values())}" for key, c in (("nan_inf_mismatches", mismatch),
                                                                 ("nan_inf_in_both", in_both)) if c)
    print(f"{'same' if same else 'different'}: {len(report['max_abs_diff'])} common tensors, "
          f"max_abs_diff={worst:.3e}{counts}, atol={atol}")
    return 0 if same else 1


def _check_flags(args: argparse.Namespace) -> None:
    """Values argparse's types let through (``--atol nan``, ``--lora-rank 0``): one line, before anything is read."""
    atol = getattr(args, "atol", None)
    if atol is not None and not (math.isfinite(atol) and atol >= 0):
        raise CheckpointError(f"--atol {atol}: must be a finite number >= 0 (the largest max abs difference allowed)")
    if getattr(args, "lora_rank", None) is not None:
        checked_lora_rank(args.lora_rank, "--lora-rank")
    if getattr(args, "lora_alpha", None) is not None:
        checked_lora_alpha(args.lora_alpha, "--lora-alpha")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    interrupted = threading.Event()
    try:
        with _noting_interrupts(interrupted):
            _check_flags(args)
            return _run(args)
    except BaseException as e:
        # Ctrl-C, also where a library wraps it in an error of its own (dcp.save: a CheckpointException, itself
        # a BaseException): the output's temporary directory is gone and an existing OUT kept
        if isinstance(e, KeyboardInterrupt) or interrupted.is_set():
            print("rl-checkpoint: interrupted", file=sys.stderr)
            return 130
        if isinstance(e, CheckpointError):
            print(f"rl-checkpoint: error: {e}", file=sys.stderr)
            return 2
        if isinstance(e, OSError):  # parent is a file, read-only directory, disk full: the output was never published
            where = f"{e.filename}: " if e.filename else ""
            print(f"rl-checkpoint: error: {where}{e.strerror or e}; nothing was written", file=sys.stderr)
            return 2
        raise


@contextlib.contextmanager
def _noting_interrupts(interrupted: threading.Event) -> Iterator[None]:
    """Set ``interrupted`` when SIGINT arrives (which still raises KeyboardInterrupt), so a Ctrl-C that a
    library turns into an error of its own (``dcp.save`` raises a CheckpointException) still ends as
    interrupted. Only in the main thread, where Python delivers signals, and only over Python's default
    handler (an embedding program's own stays)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def note(signum, frame):
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    sys.exit(main())
