"""Single-token updates of the recurrent mixers' states at decode, in place on the engine's cache:
Qwen3.5's gated delta rule and Nemotron-H's Mamba-2 selective scan.

transformers' single-step references compute them as broadcast products and sums, each of which
allocates and reads a state-sized tensor; at batch 64 the state is ~8 MB a layer, so these passes,
not the arithmetic, are the step's cost. Here each update scales the state in place, adds an in-place
batched outer product and reads it with a batched matrix-vector product.

Gated delta rule. Per row and value head, with the state ``S`` [Dk, Dv], the token's query / key ``q``, ``k`` [Dk]
(L2-normalised, ``q`` scaled by ``Dk ** -0.5``), value ``v`` [Dv], decay ``g`` and write strength
``beta``::

    S <- exp(g) * S;   delta = beta * (v - k @ S);   S <- S + outer(k, delta);   out = q @ S

transformers' ``torch_recurrent_gated_delta_rule`` computes the same as broadcast products and sums,
each of which allocates and reads a state-sized tensor (about 14 passes over the ``[B, H, Dk, Dv]``
state per layer, plus the engine's copy back into its cache). Here the state is scaled in place,
read by two batched matrix-vector products and updated by one in-place batched outer product: 6
passes, no state-sized allocation.

Mamba-2. Per row and head, with the state ``S`` [head_dim, N], step ``dt``, decay rate ``A``, the
head's input ``x`` [head_dim] and its group's ``B``, ``C`` [N]::

    S <- exp(dt * A) * S + outer(x, dt * B);   out = S @ C + D * x

(transformers' ``mamba2_selective_state_update`` in the same order; in bfloat16 it rounds
``dt * B * x`` to bfloat16 before adding it to the float32 state, here it stays float32.)

Prefill of the gated delta rule. transformers' chunked reference (``torch_chunk_gated_delta_rule``, what
runs without flash-linear-attention) pads every row to a multiple of 64 tokens and solves a 64 x 64
triangular system per row, head and chunk: on CPU about 2.4 ms per (row, chunk) at 8 heads of 64, so
a batch of 64 short prompts costs ~150 ms a layer whatever their length. The same recurrence token by
token (``gated_delta_steps``: the L2 norms and casts once, then one in-place update per token for all
rows) costs ~0.09 ms + 0.02 ms per row a token (measured on the 2-core CPU, 1 thread; fp32 results agree
to ~1e-7). On CPU ``stepwise_is_cheaper`` picks the cheaper by that cost model: the token loop for
batches of short prompts (64 rows of 56 tokens: 65 ms against 135 ms), the chunks for few long ones (1
row of 512 tokens: 20 ms against 44 ms).
"""

from __future__ import annotations

import math

import torch


def _qk_normalised(query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``query`` / ``key`` L2-normalised over the last dim, ``query`` scaled by ``Dk ** -0.5``."""
    query, key = query.float(), key.float()
    query = query * torch.rsqrt((query * query).sum(-1, keepdim=True) + 1e-6) / query.shape[-1] ** 0.5
    return query, key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)


def _delta_update(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor,
                  beta: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """One token's update of ``flat`` [N, Dk, Dv] in place (``N`` = rows x heads) from float32 ``query`` /
    ``key`` [N, 1, Dk] (normalised), ``value`` [N, 1, Dv], ``decay`` = exp(g) and ``beta`` [N, 1, 1].
    Returns ``q @ S`` [N, 1, Dv]."""
    flat.mul_(decay)
    delta = (value - torch.bmm(key, flat)) * beta  # beta * (v - k @ S)
    flat.baddbmm_(key.transpose(1, 2), delta)  # S += outer(k, delta)
    return torch.bmm(query, flat)


# A decode step on CPU updates the states in blocks of at most this many bytes (64 of 64 x 64 in float32),
# each block's passes (scale, read, outer-product add, read) done while it sits in the core's L2 cache,
# instead of each pass over a layer's whole state (8 MB at 64 rows x 8 heads). Both mixers' decode updates.
STATE_BLOCK_BYTES = 1 << 20


def decode_block_bytes(state: torch.Tensor) -> int | None:
    """The block size of a decode update of ``state``: ``STATE_BLOCK_BYTES`` on CPU; elsewhere None (one
    block: a GPU reads the states from memory either way, and every block is four more kernel launches)."""
    return STATE_BLOCK_BYTES if state.device.type == "cpu" else None


def gated_delta_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token of the gated delta rule for ``B`` rows, updating ``state`` in place.

    ``query`` / ``key`` [B, 1, H, Dk] (before the L2 norm), ``value`` [B, 1, H, Dv], ``g`` / ``beta``
    [B, 1, H], ``state`` [B, H, Dk, Dv] float32 (contiguous). Returns the output [B, 1, H, Dv] in
    ``query``'s dtype. On CPU the (row, head) states are updated ``STATE_BLOCK_BYTES`` at a time: the same
    products on each state, 1.2-1.3x faster at 64 rows x 8 heads of 64 x 64 (2-core CPU, torch 2.13)."""
    return gated_delta_steps(query, key, value, g, beta, state, block_bytes=decode_block_bytes(state))


def mamba2_step(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                d: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token of Mamba-2 for ``R`` rows, updating ``state`` in place.

    ``x`` [R, H, head_dim], ``dt`` [R, H] (after softplus and clamp), ``a`` / ``d`` [H], ``b`` / ``c``
    [R, G, N] (G groups of H // G heads), ``state`` [R, H, head_dim, N] float32 (contiguous). Returns
    the output [R, H, head_dim] in ``x``'s dtype. On CPU the (row, head) states are updated
    ``STATE_BLOCK_BYTES`` at a time."""
    rows, heads, head_dim = x.shape
    groups, size = b.shape[1:]
    flat = state.view(rows * heads, head_dim, size)
    decay = torch.exp(dt.float() * a.float()).reshape(-1, 1, 1)
    b, c = (t.repeat_interleave(heads // groups, dim=1) for t in (b, c))  # [R, H, N]: each head's group
    written = (dt[..., None] * b).float().reshape(-1, 1, size)  # dt * B, [R * H, 1, N]
    inputs, readout = x.float().reshape(-1, head_dim, 1), c.float().reshape(-1, size, 1)
    out = []
    for part in state_blocks(flat, decode_block_bytes(state)):
        block = flat[part]
        block.mul_(decay[part])
        block.baddbmm_(inputs[part], written[part])  # S += outer(x, dt * B)
        out.append(torch.bmm(block, readout[part]))  # S @ C
    return (_joined(out).view(rows, heads, head_dim) + x * d[:, None]).to(x.dtype)


def state_blocks(flat: torch.Tensor, block_bytes: int | None) -> list[slice]:
    """Slices of the first axis of ``flat`` [N, a, b] (one recurrent state per row and head), each covering
    at most ``block_bytes`` of states (None: one slice of all)."""
    count = flat.shape[0]
    per = count if block_bytes is None else max(1, block_bytes // (flat[0].numel() * flat.element_size()))
    return [slice(start, start + per) for start in range(0, count, per)]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The blocks' outputs as one tensor (one block: itself, no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# Cost model of the gated delta rule's prefill (ms, CPU, 8 heads of 64): chunked reference per (row,
# 64-token chunk); token loop per token, fixed and per row (see the module docstring).
CHUNK_MS_PER_ROW_CHUNK = 2.4
STEP_MS_PER_TOKEN, STEP_MS_PER_ROW_TOKEN = 0.09, 0.02


def stepwise_is_cheaper(rows: int, tokens: int) -> bool:
    """Whether ``gated_delta_steps`` beats the chunked reference for ``rows`` prompts of ``tokens``."""
    chunked = CHUNK_MS_PER_ROW_CHUNK * rows * math.ceil(tokens / 64)
    return tokens * (STEP_MS_PER_TOKEN + STEP_MS_PER_ROW_TOKEN * rows) < chunked


def gated_delta_steps(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, state: torch.Tensor, block_bytes: int | None = None) -> torch.Tensor:
    """``q`` consecutive tokens of the gated delta rule, one in-place update of ``state`` each: ``query`` /
    ``key`` [B, q, H, Dk] (before the L2 norm), ``value`` [B, q, H, Dv], ``g`` / ``beta`` [B, q, H];
    ``state`` [B, H, Dk, Dv] float32 (contiguous) is updated in place to the state after the last token.
    Returns [B, q, H, Dv] in ``query``'s dtype. The normalisation, casts and layout (token-major, so that
    each token's slice is one contiguous [B * H, 1, D] block) are done once for all tokens. ``block_bytes``:
    each token updates the (row, head) states that many bytes of them at a time (None: all at once)."""
    batch, length, heads, k_dim = key.shape
    v_dim, dtype = value.shape[-1], query.dtype
    query, key = _qk_normalised(query, key)
    per_token = [x.transpose(0, 1).reshape(length, batch * heads, 1, -1)  # [q, B * H, 1, D]
                 for x in (query, key, value.float(), g.float().exp()[..., None], beta.float()[..., None])]
    flat = state.view(batch * heads, k_dim, v_dim)
    blocks = state_blocks(flat, block_bytes)
    out = torch.stack([_joined([_delta_update(*(x[t][part] for x in per_token), flat[part]) for part in blocks])
                       for t in range(length)])
    return out.view(length, batch, heads, v_dim).transpose(0, 1).to(dtype)
