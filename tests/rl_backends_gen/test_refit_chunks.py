"""Refit buckets: sizes, order, every tensor once, the cast to the engine dtype, streaming, and the
4 GiB message limit of vLLM's RPC (no vLLM needed)."""

from __future__ import annotations

import io

import pytest
import torch
from pydantic import ValidationError

from rl_backends_gen import GenerationConfig
from rl_backends_gen.weights import chunk_named_tensors


def named(sizes: list[int], dtype=torch.float32) -> list[tuple[str, torch.Tensor]]:
    return [(f"w{i}", torch.full((n,), float(i), dtype=dtype)) for i, n in enumerate(sizes)]


def nbytes(chunk) -> int:
    return sum(t.numel() * t.element_size() for _, t in chunk)


def test_chunks_keep_order_hold_every_tensor_once_and_respect_the_limit():
    tensors = named([10, 30, 5, 60, 1, 1, 25])  # fp32: 40, 120, 20, 240, 4, 4, 100 bytes
    chunks = list(chunk_named_tensors(tensors, 128))
    assert [[name for name, _ in c] for c in chunks] == [["w0"], ["w1"], ["w2"], ["w3"], ["w4", "w5", "w6"]]
    assert [nbytes(c) for c in chunks] == [40, 120, 20, 240, 108]
    assert all(nbytes(c) <= 128 for c in chunks if len(c) > 1)  # only a lone tensor may exceed the limit
    flat = [(name, t) for c in chunks for name, t in c]
    assert [name for name, _ in flat] == [name for name, _ in tensors]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(flat, tensors))


def test_every_tensor_alone_with_a_one_byte_limit():
    chunks = list(chunk_named_tensors(dict(named([3, 4, 5])), 1))  # a dict is accepted too
    assert [[name for name, _ in c] for c in chunks] == [["w0"], ["w1"], ["w2"]]


def test_floating_tensors_are_cast_to_the_engine_dtype_and_counted_after_the_cast():
    tensors = named([16, 16]) + [("position_ids", torch.arange(8))]
    chunks = list(chunk_named_tensors(tensors, 64, dtype="bfloat16"))
    assert [[name for name, _ in c] for c in chunks] == [["w0", "w1"], ["position_ids"]]  # 32 + 32 bytes in bf16
    assert [t.dtype for c in chunks for _, t in c] == [torch.bfloat16, torch.bfloat16, torch.int64]
    assert all(t.is_contiguous() and t.device.type == "cpu" for c in chunks for _, t in c)


def test_a_generator_is_streamed_one_chunk_at_a_time():
    taken = []

    def stream():
        for name, tensor in named([10, 10, 10, 10]):
            taken.append(name)
            yield name, tensor

    chunks = chunk_named_tensors(stream(), 80)
    first = next(chunks)
    assert [name for name, _ in first] == ["w0", "w1"]
    assert taken == ["w0", "w1", "w2"]  # the third tensor closed the first chunk; the fourth is not read yet
    assert [[name for name, _ in c] for c in chunks] == [["w2", "w3"]]


def test_bad_limit_is_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        list(chunk_named_tensors(named([1]), 0))
    with pytest.raises(ValidationError, match="refit_bucket_bytes"):
        GenerationConfig(refit_bucket_bytes=2**31)  # above 1 GiB: too close to vLLM's 4 GiB message limit


def test_vllm_message_over_the_rpc_limit_names_the_tensor(monkeypatch):
    from rl_backends_gen import vllm_backend

    monkeypatch.setattr(vllm_backend, "MAX_RPC_BYTES", 5000)
    small = named([10])
    assert torch.equal(torch.load(io.BytesIO(vllm_backend._serialize(small)))[0][1], small[0][1])
    with pytest.raises(ValueError, match="largest tensor 'w1'"):
        vllm_backend._serialize(named([10, 2000]))
