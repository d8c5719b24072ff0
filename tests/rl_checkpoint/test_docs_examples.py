"""Every `rl-checkpoint` line in docs/checkpoint.md's bash blocks runs, in order, against a tiny run laid
out as a training run writes it (runs/grpo/checkpoints/step_000005/...)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rl_checkpoint.cli import main

DOC = Path(__file__).parents[2] / "docs" / "checkpoint.md"


def documented_commands() -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines() if line.startswith("rl-checkpoint ")]


def test_the_docs_show_the_run_layout_commands():
    commands = documented_commands()
    assert "rl-checkpoint dcp-to-hf runs/grpo exported/ --dtype bf16" in commands
    assert sum("runs/grpo" in c for c in commands) >= 4


def test_run_directory_examples(tiny_run, tmp_path, monkeypatch, capsys):
    assert tiny_run == tmp_path / "runs" / "grpo"
    monkeypatch.chdir(tmp_path)
    for command in documented_commands():
        if ".gguf" in command:
            continue  # below: needs the SmolLM2 GGUF
        argv = shlex.split(command)[1:]
        assert main(argv) == 0, f"{command}: {capsys.readouterr().err}"
    assert (tmp_path / "exported" / "config.json").is_file() and (tmp_path / "start" / "manifest.json").is_file()


@pytest.mark.slow
def test_gguf_example(tmp_path, monkeypatch):
    from test_gguf import smollm2_gguf

    (command,) = [c for c in documented_commands() if ".gguf" in c]
    gguf = smollm2_gguf()
    monkeypatch.chdir(tmp_path)
    (tmp_path / gguf.name).symlink_to(gguf)
    assert main(shlex.split(command)[1:]) == 0
    assert (tmp_path / "smollm2" / "tokenizer.json").is_file()
