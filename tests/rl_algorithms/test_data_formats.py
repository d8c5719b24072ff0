"""Every training command's data in every form: TRL's layouts (prompt/completion, messages, prompt/chosen/
rejected with an explicit or implicit prompt, prompt-only, text; plain or conversational) read from JSONL,
JSON, parquet and `datasets` directories give the same samples; a missing field names the key to set."""

from __future__ import annotations

import pytest

from rl_algorithms.data import (
    ChatDataConfig,
    DataError,
    PreferenceDataConfig,
    PromptDataConfig,
    TextDataConfig,
    load_chat_dataset,
    load_preference_dataset,
    load_prompt_dataset,
    load_text_dataset,
)

FORMATS = ["jsonl", "json", "parquet", "datasets"]
USER = {"role": "user", "content": "What is 2 + 3?"}
ANSWER = {"role": "assistant", "content": "It is 5."}
WRONG = {"role": "assistant", "content": "It is 7."}

SFT_LAYOUTS = {
    "prompt_completion": [{"prompt": "What is 2 + 3?", "completion": "It is 5."}],
    "conversational_prompt_completion": [{"prompt": [USER], "completion": [ANSWER]}],
    "messages": [{"messages": [USER, ANSWER]}],
    "prompt_response": [{"prompt": "What is 2 + 3?", "response": "It is 5."}],  # the earlier field name
}
PREFERENCE_LAYOUTS = {
    "plain": [{"prompt": "What is 2 + 3?", "chosen": "It is 5.", "rejected": "It is 7."}],
    "conversational": [{"prompt": [USER], "chosen": [ANSWER], "rejected": [WRONG]}],
    "implicit_prompt": [{"chosen": [USER, ANSWER], "rejected": [USER, WRONG]}],
}


def masked_text(tokenizer, sample) -> str:
    return tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", list(SFT_LAYOUTS))
def test_sft_rows_in_every_layout_and_format(tmp_path, write_rows, tiny_tokenizer, fmt, layout):
    path = write_rows(SFT_LAYOUTS[layout], tmp_path, fmt)
    [sample] = load_chat_dataset(path, ChatDataConfig(train_path=path), tiny_tokenizer).items
    assert sample.input_ids == tiny_tokenizer.apply_chat_template([USER, ANSWER], tokenize=True, return_dict=False)
    assert masked_text(tiny_tokenizer, sample) == "It is 5.<|im_end|>"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", list(PREFERENCE_LAYOUTS))
def test_preference_rows_in_every_layout_and_format(tmp_path, write_rows, tiny_tokenizer, fmt, layout):
    path = write_rows(PREFERENCE_LAYOUTS[layout], tmp_path, fmt)
    [(chosen, rejected)] = load_preference_dataset(path, PreferenceDataConfig(train_path=path), tiny_tokenizer).items
    assert chosen.input_ids == tiny_tokenizer.apply_chat_template([USER, ANSWER], tokenize=True, return_dict=False)
    assert masked_text(tiny_tokenizer, chosen) == "It is 5.<|im_end|>"
    assert masked_text(tiny_tokenizer, rejected) == "It is 7.<|im_end|>"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("prompt", ["What is 2 + 3?", [USER]], ids=["plain", "conversational"])
def test_prompt_rows_in_every_format(tmp_path, write_rows, tiny_tokenizer, fmt, prompt):
    path = write_rows([{"prompt": prompt}], tmp_path, fmt)
    [ids] = load_prompt_dataset(path, PromptDataConfig(train_path=path), tiny_tokenizer).items
    assert ids == tiny_tokenizer.apply_chat_template([USER], tokenize=True, add_generation_prompt=True,
                                                     return_dict=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_text_rows_in_every_format(tmp_path, write_rows, tiny_tokenizer, fmt):
    path = write_rows([{"text": "2 + 3 = 5"}, {"text": "café"}], tmp_path, fmt)
    assert load_text_dataset(path, TextDataConfig(train_path=path), [tiny_tokenizer]).items == ["2 + 3 = 5", "café"]


def test_a_dataset_dict_gives_each_path_its_split(tmp_path, tiny_tokenizer):
    import datasets

    datasets.disable_progress_bars()
    folder = str(tmp_path / "saved")
    rows = lambda answer: [{"prompt": "What is 2 + 3?", "completion": answer}]  # noqa: E731
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows("It is 5.")),
                          "validation": datasets.Dataset.from_list(rows("It is 7."))}).save_to_disk(folder)
    [train] = load_chat_dataset(folder, ChatDataConfig(train_path=folder), tiny_tokenizer).items
    assert masked_text(tiny_tokenizer, train) == "It is 5.<|im_end|>"
    cfg = ChatDataConfig(train_path=folder + "/train", validation_path=folder)
    [val] = load_chat_dataset(folder, cfg, tiny_tokenizer).items
    assert masked_text(tiny_tokenizer, val) == "It is 7.<|im_end|>"
    both = ChatDataConfig(train_path=folder, validation_path=folder)
    with pytest.raises(DataError, match=r"name the same DatasetDict directory; name a split in each: "
                                        r"data.train_path=.*saved/train data.validation_path=.*saved/validation"):
        load_chat_dataset(folder, both, tiny_tokenizer)


@pytest.mark.parametrize(("cfg", "load", "row", "says"), [
    (ChatDataConfig, load_chat_dataset, {"question": "q", "answer": "a"},
     "missing field 'completion' (fields present: 'question', 'answer'); set data.response_key to the field that "
     "holds it (for chat rows: data.messages_key)"),
    (ChatDataConfig, load_chat_dataset, {"completion": "a"}, "missing field 'prompt'"),
    (PreferenceDataConfig, load_preference_dataset, {"prompt": "q", "good": "a", "rejected": "b"},
     "missing field 'chosen' (fields present: 'prompt', 'good', 'rejected'); set data.chosen_key"),
    (PreferenceDataConfig, load_preference_dataset,
     {"chosen": [ANSWER], "rejected": [WRONG]}, "set data.prompt_key to the prompt's field"),
    (PromptDataConfig, load_prompt_dataset, {"question": "q"}, "set data.prompt_key"),
    (TextDataConfig, lambda path, cfg, tok: load_text_dataset(path, cfg, [tok]), {"content": "x"}, "set data.text_key"),
])
def test_a_missing_field_names_the_key_to_set(tmp_path, write_rows, tiny_tokenizer, cfg, load, row, says):
    path = write_rows([row], tmp_path, "jsonl")
    with pytest.raises(DataError) as err:
        load(path, cfg(train_path=path), tiny_tokenizer)
    assert f"{path}, line 1: " in str(err.value) and says in str(err.value)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize(("row", "says"), [
    ({"prompt": None, "completion": "a"}, "field 'prompt' is null."),
    ({"prompt": "q", "completion": None}, "field 'completion' is null."),
])
def test_a_null_field_is_called_null_not_missing(tmp_path, write_rows, tiny_tokenizer, fmt, row, says):
    """A null (JSON null, an empty parquet cell) is a field without a value, not a field to look for elsewhere."""
    path = write_rows([{"prompt": "q", "completion": "a"}, row], tmp_path, fmt)
    with pytest.raises(DataError) as err:
        load_chat_dataset(path, ChatDataConfig(train_path=path), tiny_tokenizer)
    unit = "line" if fmt == "jsonl" else "row"
    assert f"{path}, {unit} 2: {says} Fix or remove the row" in str(err.value) and "missing" not in str(err.value)
