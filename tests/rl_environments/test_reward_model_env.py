"""The reward-model environment scores conversations with a sequence-classification model directory."""

from __future__ import annotations

import pickle

import pytest
import torch

from rl_environments import RewardModelEnvironment


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification

    from rl_core.models import build_tiny_tokenizer, tiny_model_config

    tokenizer = build_tiny_tokenizer()
    config = tiny_model_config(tokenizer, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    path = tmp_path_factory.mktemp("tiny-rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def conversation(answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": answer}]


def test_scores_match_the_model_and_batching(reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    env = RewardModelEnvironment(reward_model_dir, batch_size=2)
    answers = ["4", "The answer is \\boxed{4} because two plus two is four.", "five", "22"]
    items = [(conversation(a), {}, None) for a in answers]
    batched = [r.reward for r in env.step_batch(items)]
    single = [env.step(*item).reward for item in items]
    assert batched == pytest.approx(single, abs=1e-5)  # padding does not change a score
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    text = tokenizer.apply_chat_template(conversation(answers[1]), tokenize=False)
    with torch.no_grad():
        expected = model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
    assert batched[1] == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in batched)) == 4
    result = env.step(*items[0])
    assert result.reward_components == {"score": result.reward} and result.done


def test_pickles_without_the_model_and_missing_dir_is_clear(reward_model_dir, tmp_path):
    env = RewardModelEnvironment(reward_model_dir)
    env.step(conversation("4"), {}, None)
    assert pickle.loads(pickle.dumps(env))._loaded is None
    with pytest.raises(FileNotFoundError, match="rl rm"):
        RewardModelEnvironment(str(tmp_path / "nope"))
