"""Recurrent token mixers over the engine's ``RecurrentState`` cache: Qwen3.5's gated delta-net
(linear attention) and Nemotron-H's Mamba-2.

Both are a causal depthwise convolution followed by a linear recurrence over a fixed-size state. The
engine keeps, per row, the convolution's last ``kernel - 1`` inputs and the recurrent state:

* prefill runs transformers' own chunked kernels over right-padded prompts (on CPU the gated delta
  rule of a batch of short prompts runs token by token instead, which is cheaper: ``recurrent_steps``).
  Padding must not touch the state, so at padded positions the recurrence is made the identity (gated
  delta-net: decay ``g = 0`` and write strength ``beta = 0``; Mamba-2: step ``dt = 0``), and the
  convolution state is gathered at each row's own last inputs. After a shared prefix, the rows start from the prefix's
  state and convolution inputs.
* decode updates the active rows' states in place, one token at a time (the gated delta rule and
  Mamba-2's scan as a few in-place batched products, ``recurrent_steps.py``; the convolution as one
  dot product per channel): O(1) per token.

``install(module)`` replaces the mixer's ``forward`` on the engine's own model instance (its
parameters, names and weight updates are untouched); the kernels are the functions of the module's
own transformers modeling file.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from rl_backends_gen.native import recurrent_steps
from rl_backends_gen.native.cache import RecurrentState
from rl_backends_gen.native.steps import DecodeStep


def install_gated_delta_net(module) -> None:
    module.forward = types.MethodType(gated_delta_net_forward, module)


def install_mamba2(module) -> None:
    module.forward = types.MethodType(mamba2_forward, module)


def convolve(module, inputs: torch.Tensor, step, layer: RecurrentState) -> torch.Tensor:
    """The mixer's causal depthwise convolution of ``inputs`` [B, C, q] (activation applied),
    continuing from and updating each row's cached last inputs (``layer["conv"]`` [rows, kernel - 1, C]:
    channels last, so that a decode step's window is ``kernel`` contiguous [R, C] slices)."""
    kernels = sys.modules[type(module).__module__]
    weight, bias = module.conv1d.weight.squeeze(1), module.conv1d.bias  # [C, kernel], [C] or None
    states = layer["conv"]  # [rows, kernel - 1, C]
    if isinstance(step, DecodeStep):
        # One output per row: each channel's dot product with its last `kernel` inputs, summed over the
        # window's middle axis of `kernel` contiguous [R, C] slices: ~3.5x faster than the same sum over a
        # last axis of `kernel` elements (64 rows x 1024 channels, bf16, 2-core CPU: 0.15 against 0.55 ms),
        # and CPU conv1d costs ~ms per call at these sizes. The window's tail becomes the new state.
        rows = inputs.shape[0]
        window = torch.cat([states[:rows], inputs.transpose(1, 2).to(states.dtype)], dim=1)  # [R, kernel, C]
        states[:rows] = window[:, 1:]
        out = (window * weight.t().contiguous()).sum(dim=1)  # the strided weight.t() would make the product slow
        if bias is not None:
            out = out + bias
        return ACT2FN[module.activation](out).to(inputs.dtype)[..., None]  # [R, C, 1]
    keep = states.shape[1]
    if step.start:
        before = states[step.first_slot_of_row].transpose(1, 2)
    else:  # zeros: what the convolution's own left padding would read
        before = inputs.new_zeros(inputs.shape[0], inputs.shape[1], keep)
    history = torch.cat([before, inputs], dim=-1)  # [P, C, keep + q]
    out = kernels.causal_conv1d_fn(history, weight, bias, activation=module.activation)[..., keep:]
    # Each row's last `keep` real inputs: history positions lengths .. lengths + keep - 1.
    index = (step.lengths[:, None] + torch.arange(keep, device=inputs.device)[None, :])[:, None, :]
    last = history.gather(2, index.expand(-1, inputs.shape[1], -1))[step.row_of_slot]  # [A, C, keep]
    states[step.slots] = last.transpose(1, 2).to(states.dtype)
    return out


def gated_delta_net_forward(self, hidden_states, cache_params=None, attention_mask=None, rl_step=None, **kwargs):
    """Qwen3.5 linear attention: ``hidden_states`` [B, q, hidden] -> [B, q, hidden]."""
    kernels = sys.modules[type(self).__module__]
    layer = rl_step.cache.layers[self.layer_idx]
    batch, length, _ = hidden_states.shape
    mixed = convolve(self, self.in_proj_qkv(hidden_states).transpose(1, 2), rl_step, layer).transpose(1, 2)
    query, key, value, g, beta = delta_rule_inputs(self, mixed, self.in_proj_b(hidden_states),
                                                   self.in_proj_a(hidden_states))
    if isinstance(rl_step, DecodeStep):
        out = recurrent_steps.gated_delta_step(query, key, value, g, beta, layer["state"][:batch])  # state in place
    else:
        real = rl_step.real_tokens()[..., None]  # padding: no decay, no write
        initial = layer["state"][rl_step.first_slot_of_row] if rl_step.start else None
        if query.device.type == "cpu" and recurrent_steps.stepwise_is_cheaper(batch, length):
            final = initial.float() if initial is not None else \
                query.new_zeros(batch, self.num_v_heads, self.head_k_dim, self.head_v_dim, dtype=torch.float32)
            out = recurrent_steps.gated_delta_steps(query, key, value, g * real, beta * real, final)
        else:
            out, final = kernels.torch_chunk_gated_delta_rule(query, key, value, g=g * real, beta=beta * real,
                                                              initial_state=initial, output_final_state=True,
                                                              use_qk_l2norm_in_kernel=True)
        layer["state"][rl_step.slots] = final[rl_step.row_of_slot].to(layer["state"].dtype)
    return delta_rule_output(self, out, self.in_proj_z(hidden_states))


def delta_rule_inputs(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
    """The gated delta rule's ``(query, key, value, g, beta)`` from the convolution's output ``mixed``
    [B, q, conv_dim] and the ``b`` / ``a`` projections [B, q, v_heads], as transformers' forward makes them
    (query / key repeated over the value heads they serve)."""
    batch, length, _ = mixed.shape
    query, key, value = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch, length, -1, self.head_k_dim)
    key = key.reshape(batch, length, -1, self.head_k_dim)
    value = value.reshape(batch, length, -1, self.head_v_dim)
    beta = b.sigmoid()  # [B, q, v_heads]
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    if self.num_v_heads // self.num_k_heads > 1:
        query = query.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)
        key = key.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)
    return query, key, value, g, beta


def delta_rule_output(self, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The mixer's output from the delta rule's ``out`` [B, q, v_heads, Dv]: the gated RMSNorm with the ``z``
    projection [B, q, value_dim], then the output projection."""
    batch, length = out.shape[:2]
    out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(out.reshape(batch, length, -1))


def mamba2_forward(self, hidden_states, cache_params=None, attention_mask=None, rl_step=None, **kwargs):
    """Nemotron-H Mamba-2 mixer: ``hidden_states`` [B, q, hidden] -> [B, q, hidden].

    The step size is ``clamp(softplus(dt + dt_bias), time_step_limit)`` in prefill and decode alike,
    as in the training forward (transformers' own single-step decode skips the clamp, which only
    differs for steps below ``time_step_min``)."""
    kernels = sys.modules[type(self).__module__]
    layer = rl_step.cache.layers[self.layer_idx]
    batch, length, _ = hidden_states.shape
    heads, head_dim, groups, state_size = self.num_heads, self.head_dim, self.n_groups, self.ssm_state_size
    gate, x_b_c, dt = self.in_proj(hidden_states).split([self.intermediate_size, self.conv_dim, heads], dim=-1)
    x_b_c = convolve(self, x_b_c.transpose(1, 2), rl_step, layer).transpose(1, 2)
    x, b, c = torch.split(x_b_c, [self.intermediate_size, groups * state_size, groups * state_size], dim=-1)
    a = -torch.exp(self.A_log.float())  # [H]
    dt = F.softplus(dt + self.dt_bias.to(dt.dtype)).clamp(*self.time_step_limit)  # [B, q, H]
    if isinstance(rl_step, DecodeStep):
        out = recurrent_steps.mamba2_step(
            x.view(batch, heads, head_dim), dt[:, 0], a, b.view(batch, groups, state_size),
            c.view(batch, groups, state_size), self.D,
            layer["state"][:batch],  # [R, H, head_dim, state_size], updated in place
        ).view(batch, 1, -1)
    else:
        initial = layer["state"][rl_step.first_slot_of_row] if rl_step.start else None
        out, final = kernels.mamba2_chunk_scan(
            x.view(batch, length, heads, head_dim), dt * rl_step.real_tokens()[..., None], a,  # padding: dt = 0
            b.view(batch, length, groups, state_size), c.view(batch, length, groups, state_size),
            chunk_size=self.chunk_size, D=self.D, initial_states=initial, return_final_states=True,
        )
        layer["state"][rl_step.slots] = final[rl_step.row_of_slot].to(layer["state"].dtype)
        out = out.reshape(batch, length, -1)
    return self.out_proj(self.norm(out, gate).to(hidden_states.dtype))
