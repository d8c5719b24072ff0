"""Config validation and the micro-batch planners (no model involved)."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import make_grouped_batch
from pydantic import ValidationError

from rl_backends_train import TrainBackendConfig
from rl_backends_train.batching import (
    first_fit_decreasing,
    length_sorted_groups,
    local_normalizer_counts,
    pack_rows,
    plan_micro_batches,
    prompt_lengths,
)
from rl_backends_train.config import SchedulerConfig
from rl_backends_train.optim import lr_multiplier


def test_config_rejects_bad_layouts():
    with pytest.raises(ValidationError, match="must divide num_workers"):
        TrainBackendConfig(num_workers=3, tensor_parallel_size=2)
    with pytest.raises(ValidationError, match="at most one"):
        TrainBackendConfig(packing={"enabled": True}, dynamic_batching={"enabled": True})
    with pytest.raises(ValidationError, match="extra"):
        TrainBackendConfig(micro_batchsize=4)
    with pytest.raises(ValidationError, match="lora with tensor_parallel_size"):
        TrainBackendConfig(num_workers=2, tensor_parallel_size=2, lora={"rank": 4})
    with pytest.raises(ValidationError, match=r"sequence_parallel=True .* needs tensor_parallel_size > 1"):
        TrainBackendConfig(num_workers=2, sequence_parallel=True)
    assert TrainBackendConfig(num_workers=4, tensor_parallel_size=2).data_parallel_size == 2
    assert TrainBackendConfig(num_workers=2, tensor_parallel_size=2, sequence_parallel=True).sequence_parallel


def test_first_fit_decreasing_respects_budget_and_covers_all_rows():
    lengths = [40, 5, 12, 33, 7, 9, 25, 6]
    bins = first_fit_decreasing(lengths, 48)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 48 for b in bins)
    assert len(bins) == 3  # 137 tokens: 40+7, 33+12, 25+9+6+5 fills three bins of 48
    assert first_fit_decreasing([60, 3], 48) == [[0], [1]]  # an over-long row gets its own bin


def test_length_sorted_groups_bound_padded_tokens():
    lengths = [40, 5, 12, 33, 7, 9, 25, 6]
    groups = length_sorted_groups(lengths, 80)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= 80 or len(g) == 1


def test_pack_rows_restarts_positions_and_blocks_attention():
    batch = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    ids, pos, mask, unpack = pack_rows(batch)
    assert ids.tolist() == [[5, 6, 7, 8, 9]]
    assert pos.tolist() == [[0, 1, 2, 0, 1]]
    assert mask.shape == (1, 1, 5, 5)
    assert not mask[0, 0, 3, :3].any() and mask[0, 0, 4, 3:5].all() and not mask[0, 0, 3, 4]
    assert unpack.tolist() == [[0, 1, 2], [3, 4, 0]]
    assert torch.equal(ids[0][unpack][0], batch["input_ids"][0])


def test_pack_rows_shares_a_prompt_once():
    # Rows 0 and 2 share the prompt [5, 6] (loss from column 2); row 1 has its own prompt [8].
    batch = {"input_ids": torch.tensor([[5, 6, 7, 9], [8, 4, 0, 0], [5, 6, 3, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]),
             "loss_mask": torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0], [0, 0, 1, 0]]).float()}
    assert prompt_lengths(batch).tolist() == [2, 1, 2]
    ids, pos, mask, unpack = pack_rows(batch, share_prompts=True)
    # Segments: [5 6] (prompt A), [7 9] (row 0's answer), [8] (prompt B), [4], [3] (row 2's answer).
    assert ids.tolist() == [[5, 6, 7, 9, 8, 4, 3]]
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert unpack.tolist() == [[0, 1, 2, 3], [4, 5, 0, 0], [0, 1, 6, 0]]
    m = mask[0, 0]
    assert m[6].tolist() == [True, True, False, False, False, False, True]  # row 2's answer: prompt A + itself
    assert m[3].tolist() == [True, True, True, True, False, False, False]
    assert m[5].tolist() == [False, False, False, False, True, True, False]
    for i in range(3):  # every row reads back as itself
        n = int(batch["attention_mask"][i].sum())
        assert torch.equal(ids[0][unpack[i, :n]], batch["input_ids"][i, :n])


def test_shared_prompt_plan_keeps_groups_together_within_the_budget():
    batch = make_grouped_batch(100, [6, 9, 4], [[3, 5, 2], [4, 1, 6], [7, 7, 7]])
    cfg = TrainBackendConfig(packing={"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 20})
    mbs = plan_micro_batches(batch, cfg)
    assert sorted(int(r) for mb in mbs for r in mb.rows) == list(range(9))
    prompts = prompt_lengths(batch)
    packed_sizes = []
    for mb in mbs:
        assert mb.packed and mb.share_prompts
        ids, _, _, _ = pack_rows(mb.batch, share_prompts=True)
        packed_sizes.append(ids.shape[1])
        keys = {tuple(batch["input_ids"][int(r), : int(prompts[int(r)])].tolist()) for r in mb.rows}
        assert len(keys) == 1  # no two chunks fit one budget here
    # Prompt costs: 6 + 10, 9 + 11, and 4 + 21 > 20, split into 4 + 14 and 4 + 7.
    assert sorted(packed_sizes) == [11, 16, 18, 20]
    with pytest.raises(ValueError, match="needs packing.enabled=true"):
        TrainBackendConfig(packing={"share_prompts": True})


def test_context_and_expert_parallel_are_clear_errors():
    with pytest.raises(ValidationError, match="context_parallel_size=2 is not supported by backend=dtensor"):
        TrainBackendConfig(num_workers=2, context_parallel_size=2)
    with pytest.raises(ValidationError, match="expert_parallel_size=2 is not supported by backend=dtensor"):
        TrainBackendConfig(num_workers=2, expert_parallel_size=2)


def test_left_padding_is_rejected_with_a_clear_error():
    batch = {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.tensor([[0, 1, 1]]),
             "loss_mask": torch.ones(1, 3)}
    with pytest.raises(ValueError, match="right-padded"):
        plan_micro_batches(batch, TrainBackendConfig())


def test_normalizer_counts_use_sample_mask():
    batch = {"loss_mask": torch.tensor([[0, 1, 1], [0, 1, 0], [0, 0, 0]]).float(), "sample_mask": torch.tensor([1.0, 0.0, 1.0])}
    assert local_normalizer_counts(batch).tolist() == [2.0, 1.0]


def test_lr_schedule_warmup_then_cosine():
    cfg = SchedulerConfig(kind="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    values = [lr_multiplier(s, cfg) for s in range(8)]
    assert values[:3] == [0.5, 1.0, 1.0]
    assert values[4] == pytest.approx(0.1 + 0.9 * 0.5)
    assert values[6] == pytest.approx(0.1) and values[7] == pytest.approx(0.1)
    assert lr_multiplier(100, SchedulerConfig(kind="constant", warmup_steps=3)) == 1.0


def _policy_keys_in_package_strings() -> dict[str, str]:
    """Every ``policy.<key>`` written in a string of rl_backends_train (messages, docstrings) -> where;
    a method call (``policy.offload(...)``) is not a key."""
    import ast
    import re
    from pathlib import Path

    import rl_backends_train

    found = {}
    for path in Path(rl_backends_train.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for key in re.findall(r"(?<![\w.])policy((?:\.[a-z_][a-z0-9_]*)+)(?![\w(])", node.value):
                    found[key.lstrip(".")] = f"{path.name}:{node.lineno}"
    return found


def test_every_policy_key_named_in_the_package_exists():
    """A message that tells the user to set ``policy.<key>`` names a key of TrainBackendConfig."""
    import typing

    from pydantic import BaseModel

    keys = _policy_keys_in_package_strings()
    assert {"lora", "backend"} <= set(keys)  # the walk sees the messages (save_adapter, the extra hint)
    for key, where in keys.items():
        model: type[BaseModel] | None = TrainBackendConfig
        for part in key.split("."):
            assert model is not None and part in model.model_fields, f"{where}: policy.{key} is not a config key"
            annotation = model.model_fields[part].annotation
            candidates = [a for a in (typing.get_args(annotation) or (annotation,))
                          if isinstance(a, type) and issubclass(a, BaseModel)]
            model = candidates[0] if candidates else None


def test_fractional_gpus_are_refused_with_several_workers():
    with pytest.raises(ValidationError, match=r"gpus_per_worker=0.5 with num_workers=2: .*duplicate GPU"):
        TrainBackendConfig(num_workers=2, gpus_per_worker=0.5)
    assert TrainBackendConfig(num_workers=1, gpus_per_worker=0.5).gpus_per_worker == 0.5  # colocated, one rank
    assert TrainBackendConfig(num_workers=2, gpus_per_worker=1).gpus_per_worker == 1
