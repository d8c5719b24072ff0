"""LoRA merging (PEFT adapters and training checkpoints) and PEFT adapter export."""

from __future__ import annotations

import json

import pytest
import torch
from cli_testlib import no_leftovers, run_error

from rl_checkpoint.cli import main
from rl_checkpoint.dcp_io import save_dcp
from rl_checkpoint.safetensors_io import write_file

TARGETS = ("q_proj", "v_proj", "down_proj")


def make_adapters(base: dict[str, torch.Tensor], rank: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random lora_A [r, in] and lora_B [out, r] for TARGETS (B non-zero, so the merge changes weights)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in TARGETS:
            out[f"{module}.lora_A.weight"] = torch.randn(rank, weight.shape[1], generator=gen)
            out[f"{module}.lora_B.weight"] = torch.randn(weight.shape[0], rank, generator=gen)
    return out


def expected_merge(base, adapters, scale):
    out = dict(base)
    for name in base:
        module = name.removesuffix(".weight")
        if f"{module}.lora_A.weight" in adapters:
            delta = adapters[f"{module}.lora_B.weight"] @ adapters[f"{module}.lora_A.weight"] * scale
            out[name] = base[name] + delta
    return out


def write_peft(path, adapters, rank, alpha):
    path.mkdir()
    write_file(path / "adapter_model.safetensors", {f"base_model.model.{k}": v for k, v in adapters.items()})
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(TARGETS)}))


def test_peft_adapter_merge_equals_formula(tiny_model_dir, tmp_path, read_hf):
    base = read_hf(tiny_model_dir)
    adapters = make_adapters(base, rank=4)
    write_peft(tmp_path / "adapter", adapters, rank=4, alpha=8)
    assert main(["merge-lora", str(tmp_path / "adapter"), str(tmp_path / "merged"), "--base", tiny_model_dir]) == 0
    merged = read_hf(tmp_path / "merged")
    want = expected_merge(base, adapters, scale=8 / 4)
    assert sorted(merged) == sorted(want)
    changed = 0
    for name in want:
        torch.testing.assert_close(merged[name], want[name], rtol=0, atol=1e-6)
        changed += not torch.equal(merged[name], base[name])
    assert changed == 2 * len(TARGETS)  # 2 layers x 3 targets
    assert (tmp_path / "merged" / "config.json").is_file()


def test_training_checkpoint_with_lora(tiny_model_dir, tmp_path, read_hf):
    """dcp-to-hf folds adapters in (scale from meta.json); --adapter-only exports PEFT; merging that matches."""
    base = read_hf(tiny_model_dir)
    adapters = make_adapters(base, rank=2, seed=1)
    ckpt = tmp_path / "ckpt"
    save_dcp({"model": base | adapters}, ckpt / "dcp")
    (ckpt / "hf_config").mkdir()
    (ckpt / "hf_config" / "config.json").write_text(open(f"{tiny_model_dir}/config.json").read())
    (ckpt / "meta.json").write_text(json.dumps({"format": "rl-dcp", "lora": {"rank": 2, "alpha": 6.0}}))

    assert main(["dcp-to-hf", str(ckpt), str(tmp_path / "hf")]) == 0
    merged = read_hf(tmp_path / "hf")
    want = expected_merge(base, adapters, scale=3.0)
    assert sorted(merged) == sorted(want)
    for name in want:
        torch.testing.assert_close(merged[name], want[name], rtol=0, atol=1e-6)

    assert main(["merge-lora", str(ckpt), str(tmp_path / "peft"), "--adapter-only"]) == 0
    cfg = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 2 and cfg["lora_alpha"] == 6.0
    assert sorted(cfg["target_modules"]) == sorted(TARGETS)
    exported = read_hf(tmp_path / "peft")
    assert sorted(exported) == sorted(f"base_model.model.{k}" for k in adapters)
    assert main(["merge-lora", str(tmp_path / "peft"), str(tmp_path / "merged"), "--base", tiny_model_dir]) == 0
    again = read_hf(tmp_path / "merged")
    for name in merged:
        assert torch.equal(again[name], merged[name]), name


def test_lora_errors(tiny_model_dir, tiny_qwen2_dir, tmp_path, read_hf, capsys):
    base = read_hf(tiny_model_dir)
    adapters = make_adapters(base)
    save_dcp({"model": base | adapters}, tmp_path / "bare")
    capsys.readouterr()
    assert main(["dcp-to-hf", str(tmp_path / "bare"), str(tmp_path / "o"), "--config-dir", tiny_model_dir]) == 2
    assert "--lora-alpha" in capsys.readouterr().err
    assert main(["dcp-to-hf", str(tmp_path / "bare"), str(tmp_path / "o"), "--config-dir", tiny_model_dir,
                 "--lora-alpha", "8", "--lora-rank", "4"]) == 0
    # an adapter for a different shape of model: mismatched shapes in the merge
    wrong = {k: torch.cat([v, v], dim=1) if ".lora_A." in k else v for k, v in adapters.items()}
    write_peft(tmp_path / "wrong", wrong, rank=4, alpha=8)
    assert main(["merge-lora", str(tmp_path / "wrong"), str(tmp_path / "m"), "--base", tiny_model_dir]) == 2
    err = capsys.readouterr().err
    assert "LoRA shapes do not fit" in err and "lora_A" in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("rslora", [False, True])
def test_rslora_scale(tiny_model_dir, tmp_path, read_hf, rslora):
    base = read_hf(tiny_model_dir)
    adapters = make_adapters(base, rank=4)
    write_peft(tmp_path / "a", adapters, rank=4, alpha=8)
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text()) | {"use_rslora": rslora}
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(cfg))
    assert main(["merge-lora", str(tmp_path / "a"), str(tmp_path / "m"), "--base", tiny_model_dir]) == 0
    want = expected_merge(base, adapters, scale=8 / 2 if rslora else 8 / 4)
    got = read_hf(tmp_path / "m")
    name = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("flags, config, message", [
    (["--lora-rank", "0"], {}, "--lora-rank is 0, but a LoRA rank (PEFT's r) must be an integer >= 1; "
                               "pass the rank the adapter was trained with"),
    ([], {"r": 0}, "adapter_config.json: r is 0, but a LoRA rank (PEFT's r) must be an integer >= 1; "
                   "correct it or pass --lora-rank"),
    ([], {"r": 2.5}, "adapter_config.json: r is 2.5, but a LoRA rank"),
    (["--lora-alpha", "nan"], {"lora_alpha": None},
     "--lora-alpha is nan, but LoRA alpha must be a finite number; pass the alpha the adapter was trained with"),
    (["--lora-alpha=-inf"], {}, "--lora-alpha is -inf, but LoRA alpha must be a finite number"),
    ([], {"lora_alpha": float("nan")}, "adapter_config.json: lora_alpha is nan, but LoRA alpha must be a finite "
                                       "number; correct it or pass --lora-alpha"),
    ([], {"lora_alpha": "16"}, "adapter_config.json: lora_alpha is '16', but LoRA alpha must be a finite number"),
])
def test_rank_below_one_or_alpha_not_finite_is_refused(tiny_model_dir, tmp_path, read_hf, capsys, flags, config,
                                                        message):
    """A rank of 0 was a ZeroDivisionError traceback, and a NaN alpha a model full of NaN (exit 0)."""
    write_peft(tmp_path / "a", make_adapters(read_hf(tiny_model_dir)), rank=4, alpha=8)
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text()) | config
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    for mode in (["--base", tiny_model_dir], ["--adapter-only"]):
        err = run_error(capsys, ["merge-lora", str(tmp_path / "a"), str(tmp_path / "m"), *mode, *flags])
        assert message in err
        no_leftovers(tmp_path / "m")


def test_rank_of_a_training_checkpoint_is_checked(tiny_model_dir, tmp_path, read_hf, capsys):
    base = read_hf(tiny_model_dir)
    save_dcp({"model": base | make_adapters(base)}, tmp_path / "ckpt" / "dcp")
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps({"format": "rl-dcp", "lora": {"rank": 0, "alpha": 8}}))
    err = run_error(capsys, ["dcp-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--config-dir", tiny_model_dir])
    assert f"{tmp_path / 'ckpt' / 'meta.json'}: lora.rank is 0, but a LoRA rank (PEFT's r) must be an integer >= 1" in err
    no_leftovers(tmp_path / "hf")


def test_negative_alpha_is_merged_as_peft_merges_it(tiny_model_dir, tmp_path, read_hf):
    """PEFT checks only the rank (>= 1); alpha's sign is the user's, and the merge equals PEFT's: W + alpha/r B A."""
    base = read_hf(tiny_model_dir)
    adapters = make_adapters(base, rank=4)
    write_peft(tmp_path / "a", adapters, rank=4, alpha=-8)
    assert main(["merge-lora", str(tmp_path / "a"), str(tmp_path / "m"), "--base", tiny_model_dir]) == 0
    name = "model.layers.1.mlp.down_proj.weight"
    torch.testing.assert_close(read_hf(tmp_path / "m")[name], expected_merge(base, adapters, scale=-2.0)[name],
                               rtol=0, atol=1e-6)
