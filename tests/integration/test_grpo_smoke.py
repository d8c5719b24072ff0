"""`rl grpo` end to end on the tiny model: the smoke recipe, its metrics, and the preset recipes' configs."""

from __future__ import annotations

import os

import pytest
import yaml

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

SMOKE = recipe_path("grpo_smoke_tiny.yaml")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One run of the smoke recipe (shortened), shared by the checks below."""
    out = tmp_path_factory.mktemp("grpo-smoke")
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    code = main(["grpo", "--config", SMOKE, f"output_dir={out}", "grpo.max_steps=3", "grpo.val_every=3",
                 "logger.progress_bar=false", "val_env.name=arithmetic", "val_env.kwargs.answer_format=boxed",
                 "data.test_size=8", "grpo.test_at_end=true", "grpo.test_num_prompts=8"])
    assert code == 0
    return out


def test_smoke_recipe_trains_and_logs(smoke_run):
    records = read_jsonl_metrics(smoke_run / "metrics.jsonl")
    train = [r for r in records if "train/loss" in r or "train/skipped" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    trained = [r for r in train if r["train/skipped"] == 0.0]
    assert trained, "no step had a learning signal"
    for r in trained:
        for key in ("train/loss", "train/grad_norm", "train/clip_fraction", "train/reward_mean",
                    "train/time/generate", "train/time/train", "train/throughput/generated_tokens_per_s",
                    "train/memory/generate/cpu_rss_gib", "train/memory/train/cpu_rss_gib"):
            assert key in r and r[key] == r[key], key  # present and not NaN
    val = [r for r in records if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 3]
    assert (smoke_run / "config.yaml").is_file()
    assert (smoke_run / "metrics.png").is_file()


def test_validation_uses_its_own_grader(smoke_run):
    """`val_env` grades validation (arithmetic: correct/format) while training keeps `env` (digits)."""
    records = read_jsonl_metrics(smoke_run / "metrics.jsonl")
    val = [r for r in records if "val/accuracy" in r]
    train = [r for r in records if "train/reward/digits" in r]
    assert val and train
    for r in val:
        assert {"val/reward/correct", "val/reward/format"} <= set(r) and "val/reward/digits" not in r
    assert not any("train/reward/correct" in r for r in train)


def test_smoke_recipe_logs_example_generations(smoke_run):
    import json

    rows = [json.loads(line) for line in (smoke_run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4 + [3] * 4  # grpo.log_samples = 4 per step
    for r in rows:
        assert r["prompt"] and r["turns"][0]["role"] == "assistant"
        assert set(r["reward_components"]) == {"digits", "any_digit"}
        assert isinstance(r["reward"], float) and r["env_error"] is None
    assert sorted(p.name for p in (smoke_run / "checkpoints").iterdir()) == ["step_000003"]


def test_each_evaluation_records_its_outcome_per_prompt(smoke_run):
    """validation.jsonl: one line per validation and one for the test at the end, whose per-prompt
    correctness averages to the logged accuracy; the answers are what grading extracted."""
    import json

    records = read_jsonl_metrics(smoke_run / "metrics.jsonl")
    lines = [json.loads(line) for line in (smoke_run / "validation.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in lines] == [(0, "validation"), (3, "validation"), (3, "test")]
    logged = {(r["step"], "validation"): r["val/accuracy"] for r in records if "val/accuracy" in r}
    logged |= {(r["step"], "test"): r["test/accuracy"] for r in records if "test/accuracy" in r}
    for r in lines:
        assert len(r["correct"]) == len(r["answers"]) == 8 and set(r["correct"]) <= {"0", "1"}
        assert r["correct"].count("1") / 8 == pytest.approx(logged[r["step"], r["split"]])
        assert all(a is None or isinstance(a, str) for a in r["answers"])


def test_native_fp32_generation_matches_training_logprobs(smoke_run):
    """The native engine and the trainer share the model code: in fp32 they agree to 1e-5."""
    records = [r for r in read_jsonl_metrics(smoke_run / "metrics.jsonl") if "train/token_mult_prob_error" in r]
    assert records
    for r in records:
        assert abs(r["train/token_mult_prob_error"] - 1.0) < 1e-5
        assert r["train/gen_kl_error"] < 1e-6


@pytest.mark.parametrize("recipe", ["grpo.yaml", "dapo.yaml", "gspo.yaml", "gdpo.yaml", "grpo_arithmetic_smollm2.yaml",
                                    "grpo_smoke_tiny.yaml"])
def test_recipes_resolve(recipe, capsys):
    assert main(["grpo", "--config", recipe_path(recipe), "--print-config"]) == 0
    assert "grpo:" in capsys.readouterr().out


def test_gspo_kind_alone_runs_gspo_defaults(capsys):
    """`loss.kind=gspo` on a recipe that sets no clip range: the resolved config holds GSPO's."""
    assert main(["grpo", "--config", SMOKE, "--print-config", "loss.kind=gspo"]) == 0
    loss = yaml.safe_load(capsys.readouterr().out)["loss"]
    assert (loss["ratio_clip_low"], loss["ratio_clip_high"], loss["reduction"]) == (3e-4, 4e-4, "sequence")


def test_bad_override_exits_2_before_writing(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["grpo", "--config", SMOKE, f"output_dir={out}", "grpo.num_generation_per_prompt=4"]) == 2
    assert "num_generations_per_prompt" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("override", "says"), [
    ("env.kwargs.format_rule=boxed_last", "format_rule"),
    ("env.kwargs.answer_formt=boxed", "answer_formt"),
    ("val_env={name: arithmetc}", "Did you mean 'arithmetic'"),
])
def test_bad_environment_kwargs_exit_2_before_writing(tmp_path, capsys, override, says):
    out = tmp_path / "never"
    recipe = recipe_path("grpo_arithmetic_smollm2.yaml")
    assert main(["grpo", "--config", recipe, f"output_dir={out}", override]) == 2
    err = capsys.readouterr().err
    assert says in err and ("env" in err)
    assert not out.exists()


def test_main_recipe_grades_as_documented():
    """The default recipe's prompts and graders: the reward pays a boxed answer that restates the
    written sum; validation counts only correct boxed answers."""
    from rl_apps.commands.grpo import GRPORunConfig, build_env
    from rl_core.config import load_config

    cfg = load_config(GRPORunConfig, recipe_path("grpo_arithmetic_smollm2.yaml"), [])
    sample = cfg.data.build("validation", size=1)[0]
    question = sample.messages[-1]["content"]
    assert question.startswith("What is ") and question.endswith(r"then your final answer as \boxed{ANSWER}.")
    a, b = (int(x) for x in sample.metadata["problem"].split(" + "))
    train, val = build_env(cfg.env, "env"), build_env(cfg.val_env, "val_env")

    def grade(env, text):
        return env.step([*sample.messages, {"role": "assistant", "content": text}], sample.metadata, None).reward

    right, wrong = a + b, a + b + 1
    assert grade(train, f"{a} + {b} = {right}\n\nYour final answer is \\boxed{{{right}}}") == 1.5  # correct + 0.5 format
    assert grade(train, f"{a} + {b} = {wrong}\n\nYour final answer is \\boxed{{{wrong}}}") == 0.5
    assert grade(train, f"{a} + {b} = \\boxed{{{right}}}") == 1.0   # correct, but computed inside the box
    assert grade(train, f"{a} + {b} = {right}") == 0.0                # not boxed
    assert grade(val, f"{a} + {b} = \\boxed{{{right}}}") == 1.0
    assert grade(val, f"{a} + {b} = {right}") == 0.0


def test_variants_end_to_end(tmp_path):
    """DAPO dynamic sampling + overlong shaping, the GSPO loss, importance sampling and a KL term
    (which builds the reference model) in one short run."""
    overrides = [
        f"output_dir={tmp_path}", "grpo.max_steps=2", "grpo.val_every=0", "logger.progress_bar=false",
        "logger.tensorboard=false", "logger.plot=false", "checkpointing.enabled=false",
        "env.kwargs.weights={digits: 0.0, any_digit: 1.0}",  # binary reward: some groups have no signal
        "grpo.dapo.dynamic_sampling=true", "grpo.dapo.max_extra_rounds=2", "grpo.dapo.overlong_buffer_length=4",
        "loss.kind=gspo", "loss.reduction=sequence", "loss.ratio_clip_low=3e-4", "loss.ratio_clip_high=4e-4",
        "loss.kl_coef=0.01", "loss.importance_sampling={level: sequence, truncation: mask, weight_max: 2.0}",
    ]
    assert main(["grpo", "--config", SMOKE, *overrides]) == 0
    records = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert 1 <= r["train/dynamic_sampling/rounds"] <= 3
        if r["train/skipped"] == 0.0:
            assert r["train/kl"] >= 0.0 and "train/is_weight_mean" in r and "train/reward_shaped_mean" in r


def test_megatron_backend_with_shared_prompt_packing(tmp_path):
    """The smoke recipe on `policy.backend=megatron` with shared-prompt packing: the GPTModel trains
    in the GRPO loop, refits the native engine through HF names, and its logprobs of the sampled
    tokens agree with the engine's (fp32 on both sides)."""
    pytest.importorskip("megatron.core")
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path / "rl-cache"))
    packing = ["policy.packing.enabled=true", "policy.packing.share_prompts=true",
               "policy.packing.max_tokens_per_micro_batch=256"]
    code = main(["grpo", "--config", SMOKE, f"output_dir={tmp_path / 'run'}", "grpo.max_steps=2", "grpo.val_every=2",
                 "logger.progress_bar=false", "policy.backend=megatron", *packing])
    assert code == 0
    records = read_jsonl_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if "train/gen_kl_error" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:  # step 2 generates with weights refitted from the GPTModel
        assert r["train/gen_kl_error"] < 1e-6
        assert abs(r["train/token_mult_prob_error"] - 1.0) < 1e-5
    assert [r["step"] for r in records if "val/reward_mean" in r] == [0, 2]
