"""A DCP saved by 2 ranks (DTensors sharded on dim 0 like FSDP, and on dim 1 like row-wise TP) is
reassembled chunk by chunk into exactly the full tensors."""

from __future__ import annotations

import os

import torch
import torch.multiprocessing as mp

from rl_checkpoint.cli import main


def _save_sharded(rank: int, world: int, path: str, init_file: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = reference_tensors()
    model = {
        "model.embed_tokens.weight": distribute_tensor(full["model.embed_tokens.weight"], mesh, [Shard(0)]),
        "model.layers.0.mlp.down_proj.weight": distribute_tensor(full["model.layers.0.mlp.down_proj.weight"], mesh, [Shard(1)]),
        "lm_head.weight": distribute_tensor(full["lm_head.weight"], mesh, [Shard(0)]),
        "model.norm.weight": full["model.norm.weight"],  # replicated: saved once
    }
    dcp.save({"model": model}, checkpoint_id=path)
    dist.destroy_process_group()


def reference_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"model.embed_tokens.weight": torch.randn(9, 4, generator=gen),  # 9 rows: uneven shards 5 + 4
            "model.layers.0.mlp.down_proj.weight": torch.randn(4, 6, generator=gen),
            "lm_head.weight": torch.randn(9, 4, generator=gen).to(torch.bfloat16),
            "model.norm.weight": torch.randn(4, generator=gen)}


def test_two_rank_dcp_reassembles_exactly(tmp_path, read_hf):
    path = str(tmp_path / "dcp")
    mp.start_processes(_save_sharded, args=(2, path, str(tmp_path / "init")), nprocs=2, join=True,
                       start_method="spawn")
    from rl_checkpoint.dcp_io import DCPReader

    reader = DCPReader(path)
    assert len(reader._chunks["model.model.embed_tokens.weight"]) == 2
    assert main(["dcp-to-hf", path, str(tmp_path / "hf")]) == 0
    got = read_hf(tmp_path / "hf")
    want = reference_tensors()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    # a row range touching only the second chunk
    assert torch.equal(reader.load_rows("model.model.embed_tokens.weight", 6, 9), want["model.embed_tokens.weight"][6:9])
    os.remove(os.path.join(path, "__1_0.distcp"))
    assert main(["dcp-to-hf", path, str(tmp_path / "hf2")]) == 2
