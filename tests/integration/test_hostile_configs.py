"""Configs that used to pass and crash late, or end in a traceback (issue 17): each is exit 2, one line on
stderr naming the key, and no output directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_apps import run_setup
from rl_core.models import save_tiny_model

SFT = ("sft", "--config", "sft_tiny")
DRAFT = ("generation.speculative.method=draft",)
GRPO = ("grpo", "--config", "grpo_smoke_tiny")
CASES = {
    # name: (argv, the key the error line names); {tmp} is the test's directory, {out} the output_dir, {qwen3_5} a
    # tiny Qwen3.5 model's directory
    "max_new_tokens beyond context": ((*GRPO, "grpo.max_new_tokens=600"), "grpo.max_new_tokens"),
    "max_total_length beyond context": ((*GRPO, "grpo.max_total_length=700"), "grpo.max_total_length"),
    "generation max_seq_len beyond context": ((*GRPO, "generation.max_seq_len=1000"), "generation.max_seq_len"),
    "lr inf": ((*SFT, "policy.optimizer.lr=inf"), "policy.optimizer.lr"),
    "lr nan": ((*SFT, "policy.optimizer.lr=nan"), "policy.optimizer.lr"),
    "train_size 0": ((*GRPO, "data.train_size=0"), "data.train_size"),
    "seed 2**70": ((*SFT, f"seed={2**70}"), "seed"),
    "sft batch larger than the data": ((*SFT, "sft.batch_size=9"), "sft.batch_size"),
    "dpo batch larger than the data": (("dpo", "--config", "dpo_tiny", "dpo.batch_size=64"), "dpo.batch_size"),
    "lora target matching nothing": (("sft", "--config", "sft_tiny_lora", "policy.lora.target_modules=[qkv]"),
                                     "policy.lora.target_modules"),
    "recipe of another command": (("sft", "--config", "dpo_tiny"), "dpo_tiny.yaml is a recipe of `rl dpo`"),
    "output_dir a file": ((*SFT, "output_dir={tmp}/a_file"), "output_dir"),
    "output_dir below a file": ((*SFT, "output_dir={tmp}/a_file/run"), "output_dir"),
    "output_dir not writable": ((*SFT, "output_dir={tmp}/read_only/run"), "output_dir"),
    "output_dir under /proc": ((*SFT, "output_dir=/proc/rl-run"), "output_dir"),
    "draft with the policy's layers": ((*GRPO, *DRAFT, "generation.speculative.draft_model=policy_layers:2"),
                                       "generation.speculative.draft_model: policy_layers:2: the policy"),
    "draft from a missing path": ((*GRPO, *DRAFT, "generation.speculative.draft_model={tmp}/no_draft"),
                                  "generation.speculative.draft_model"),
    "draft from a directory without config.json": ((*GRPO, *DRAFT, "generation.speculative.draft_model={tmp}"),
                                                   "no config.json"),
    "speculation on a model with recurrent layers": ((*GRPO, "model={qwen3_5}", "generation.speculative.method=ngram"),
                                                     "generation.speculative: speculative decoding: qwen3_5_text's layer 0 is a recurrent"),
    "packing a model with recurrent layers": ((*SFT, "model={qwen3_5}", "policy.packing.enabled=true"),
                                              "policy: packing.enabled=true is not supported for qwen3_5_text"),
    "megatron on a family it does not build": ((*SFT, "model={qwen3_5}", "policy.backend=megatron"),
                                               "policy: qwen3_5_text: its gated delta-net"),
    "sglang on the cpu": ((*GRPO, "generation.backend=sglang"),
                          "generation.backend: generation.backend=sglang needs generation.device=cuda"),
    "record_routing on a dense model": ((*GRPO, "generation.record_routing=true"),
                                        "generation.record_routing: generation.record_routing=true: llama has no"),
    "draft vocabulary as large as the policy's": ((*GRPO, *DRAFT, "generation.speculative.draft_model=policy_layers:1",
                                                   "generation.speculative.draft_vocab_size=512"),
                                                  "generation.speculative.draft_vocab_size: 512"),
}

if not torch.cuda.is_available():  # a Hopper GPU runs it
    CASES["fp8 blockwise without a GPU"] = ((*SFT, "policy.precision.linear=fp8", "policy.precision.recipe=blockwise",
                                            "policy.dtype=bfloat16"), "policy: policy.precision.recipe=blockwise needs")


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_config_is_one_line_exit_2_and_writes_nothing(name, rl, tree, tmp_path, monkeypatch):
    argv, key = CASES[name]
    (tmp_path / "a_file").write_text("not a directory")
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes anywhere: report the directory as read-only, as it is for everyone else
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != read_only and access(path, mode, **kw))
    hybrid = any("{qwen3_5}" in arg for arg in argv)  # a tiny Qwen3.5: linear-attention layers
    qwen3_5 = save_tiny_model(tmp_path / "qwen3_5", family="qwen3_5_text") if hybrid else None
    argv = [arg.format(tmp=tmp_path, qwen3_5=qwen3_5) for arg in argv]
    if not any(arg.startswith("output_dir=") for arg in argv):
        argv.append(f"output_dir={tmp_path / 'out'}")
    before = tree(tmp_path)

    result = rl(*argv)
    assert result.code == 2, result.err
    [line] = result.error_lines(argv[0])
    assert key in line
    assert "Traceback" not in result.err
    assert tree(tmp_path) == before
    assert not Path("/proc/rl-run").exists()


def test_lora_target_error_from_a_ray_worker_is_one_line(rl, ray_session, tmp_path, monkeypatch):
    """The same mistake found inside a Ray worker (here with the early check switched off) arrives as a
    WorkerError whose cause is the config error: still one line, exit 2."""
    monkeypatch.setattr(run_setup, "check_lora_targets", lambda backend, model_path: None)
    result = rl("sft", "--config", "sft_tiny_lora", "policy.use_ray=true", "policy.lora.target_modules=[qkv]",
                f"output_dir={tmp_path / 'out'}")
    assert result.code == 2
    [line] = result.error_lines("sft")
    # The config error crossed the process boundary whole (its problems, not a re-wrapped message).
    assert line.startswith("rl sft: Invalid config: config: policy.lora.target_modules: ['qkv'] match no nn.Linear of llama")
    assert "q_proj" in line
    assert "Traceback" not in result.err


def test_cluster_address_auto_without_a_cluster(tmp_path):
    """`cluster.address=auto` with no Ray running. Other tests' Ray instances may run on this machine,
    and Ray's "auto" joins any it finds: its search is made to find none, as on a machine without one."""
    code = ("import sys, ray._private.services as services\n"
            "def no_cluster():\n"
            "    return []\n"
            "no_cluster.cache_clear = lambda: None\n"
            "services.find_gcs_addresses = no_cluster\n"
            "services.find_bootstrap_address = lambda temp_dir: None\n"
            "from rl_apps.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    out = tmp_path / "out"
    env = {**os.environ, "RL_CACHE_DIR": os.environ.get("RL_CACHE_DIR", str(Path.home() / ".cache" / "rl"))}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run([sys.executable, "-c", code, *SFT, "policy.use_ray=true", "cluster.address=auto",
                             f"output_dir={out}"], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("rl sft:")]
    assert "cluster.address" in line and "ray start --head" in line
    assert "Traceback" not in result.stderr
    assert not out.exists()
