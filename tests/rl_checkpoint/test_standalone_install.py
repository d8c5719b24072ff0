"""``pip install ./packages/rl-checkpoint`` alone (plus torch) converts a DCP checkpoint: no Ray, no
transformers, no vLLM, no Megatron, and nothing else of this monorepo."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_standalone_install_converts(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py, pip = venv / "bin" / "python", [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    run(pip + ["torch==2.13.0"])
    run(pip + [str(REPO / "packages" / "rl-checkpoint")])

    absent = "import importlib.util as u; print([m for m in ('ray','transformers','vllm','megatron','rl_core','rl_eval') if u.find_spec(m)])"
    assert run([str(py), "-c", absent]).stdout.strip() == "[]"

    make_dcp = textwrap.dedent(f"""
        import json, os, torch, torch.distributed.checkpoint as dcp
        torch.manual_seed(0)
        model = {{"model.embed_tokens.weight": torch.randn(32, 8), "model.norm.weight": torch.ones(8),
                 "lm_head.weight": torch.randn(32, 8, dtype=torch.bfloat16)}}
        dcp.save({{"model": model, "optimizer": {{"step": torch.tensor(1.0)}}}}, checkpoint_id="{tmp_path}/ckpt/dcp", no_dist=True)
        os.makedirs("{tmp_path}/ckpt/hf_config")
        json.dump({{"model_type": "llama"}}, open("{tmp_path}/ckpt/hf_config/config.json", "w"))
        json.dump({{"format": "rl-dcp"}}, open("{tmp_path}/ckpt/meta.json", "w"))
        torch.save(model, "{tmp_path}/expected.pt")
    """)
    run([str(py), "-c", make_dcp])
    run([str(venv / "bin" / "rl-checkpoint"), "dcp-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")])

    check = textwrap.dedent(f"""
        import torch
        from safetensors.torch import load_file
        expected = torch.load("{tmp_path}/expected.pt", weights_only=True)
        got = load_file("{tmp_path}/hf/model-00001-of-00001.safetensors")
        assert sorted(got) == sorted(k for k in expected), sorted(got)
        assert all(torch.equal(got[k], v) for k, v in expected.items())
        print("ok")
    """)
    assert run([str(py), "-c", check]).stdout.strip() == "ok"
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == {"model_type": "llama"}
