"""Gated DeltaNet (Qwen3-Next's linear-attention layers) over per-sequence state slots.

A linear layer keeps no per-token cache: each sequence owns one slot holding the short
convolution's last kernel-1 inputs (conv_dim values each) and, per value head, a
(key_dim x value_dim) matrix S, updated token by token by the gated delta rule:

    S_t = g_t S_{t-1} + k_t d_t^T,   d_t = beta_t (v_t - g_t S_{t-1}^T k_t),   o_t = S_t^T q_t

with q, k L2-normalised (q also times key_dim ** -0.5), g_t = exp(-exp(A_log) softplus(a_t +
dt_bias)) and beta_t = sigmoid(b_t). Stages, under Hugging Face's names:

    in_proj_qkvz, in_proj_ba -> q, k, v, z (output gate), b, a   (grouped per key head)
    conv1d: depthwise causal conv of kernel K over [q, k, v], SiLU; its state: last K-1 inputs
    the delta rule: recurrent form for one token a sequence (decode), chunked form otherwise
    norm: RMSNorm of each head's output times silu(z);  out_proj

The chunked form (chunks of 64) is exact algebra, not an approximation: inside a chunk,
with G_i the cumulative log decay, the d_i solve the unit lower-triangular system
(I + A) d = beta (V - exp(G) (K S_0)), A_ij = beta_i exp(G_i - G_j) k_i . k_j for j < i; then
O = exp(G) (Q S_0) + (exp(G_i - G_j) q_i . k_j)_{j <= i} d and S_C = exp(G_C) S_0 + K^T
(exp(G_C - G_j) d_j). Both forms are tested equal, and against transformers.
A chunk that starts a sequence (position 0) starts from a zero state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.config import ModelConfig
from inferpath.config_kinds import linear_conv_dim

CHUNK = 64


class GatedRMSNorm(nn.Module):
    """rmsnorm(x) * weight * silu(z) over each head's value_dim, in float32 (``norm``)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # x, z: (rows, value_dim)
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)
        return (self.weight * normed * F.silu(z.float())).to(x.dtype)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the eps inside the root, as FLA and transformers)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def recurrent_step(q, k, v, g, beta, state):
    """One token per row. q, k: (S, H, dk); v: (S, H, dv); g, beta: (S, H); state: (S, H, dk, dv)
    -> (out (S, H, dv), new state). All float32."""
    state = state * g.exp()[..., None, None]
    kv_mem = torch.einsum("shkv,shk->shv", state, k)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("shkv,shk->shv", state, q), state


def chunked_delta_rule(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The chunked form for one sequence. q, k: (H, L, dk); v: (H, L, dv); g, beta: (H, L);
    state: (H, dk, dv) -> (out (H, L, dv), final state). All float32."""
    outs = []
    for start in range(0, q.shape[1], chunk):
        sl = slice(start, start + chunk)
        qc, kc, vc, gc, bc = q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl]
        n = qc.shape[1]
        cum = gc.cumsum(dim=-1)  # (H, n): log of the decay since the chunk's start
        decay = (cum[:, :, None] - cum[:, None, :])  # (H, n, n): G_i - G_j
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        ratio = torch.where(causal, decay, torch.full_like(decay, float("-inf"))).exp()  # exp(G_i - G_j), j <= i
        strict = ratio * (~torch.eye(n, dtype=torch.bool, device=q.device))
        a = bc[:, :, None] * strict * (kc @ kc.transpose(1, 2))  # (H, n, n), strictly lower
        rhs = bc[:, :, None] * (vc - cum.exp()[:, :, None] * (kc @ state))  # (H, n, dv)
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append(cum.exp()[:, :, None] * (qc @ state) + (ratio * (qc @ kc.transpose(1, 2))) @ delta)
        tail = (cum[:, -1:] - cum).exp()  # (H, n): exp(G_C - G_j)
        state = cum[:, -1].exp()[:, None, None] * state + kc.transpose(1, 2) @ (tail[:, :, None] * delta)
    return torch.cat(outs, dim=1), state


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet layer (module doc); its states live in ``kv_cache``'s slot pools."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        self.kernel = config.linear_conv_kernel_dim
        self.conv_dim = linear_conv_dim(config)
        h = config.hidden_size
        self.split = config.linear_split_projections
        if self.split:  # Qwen3.5: [all q, all k, all v], z, b and a each their own matrix
            self.in_proj_qkv = nn.Linear(h, 2 * self.key_dim + self.value_dim, bias=False)
            self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(h, self.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(h, self.num_v_heads, bias=False)
        else:  # Qwen3-Next: grouped per key head
            self.in_proj_qkvz = nn.Linear(h, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(h, 2 * self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False,
                                padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def split_projections(self, x: torch.Tensor):
        """q, k (T, Hk * dk), v, z (T, Hv * dv), b, a (T, Hv): the checkpoint groups each
        key head's q, k and its value heads' v, z (and b, a) together; Qwen3.5's keep each
        part whole, heads in the same order."""
        if self.split:
            q, k, v = self.in_proj_qkv(x).split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
            return q, k, v, self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        num_tokens, group = x.shape[0], self.num_v_heads // self.num_k_heads
        qkvz = self.in_proj_qkvz(x).view(num_tokens, self.num_k_heads, -1)
        ba = self.in_proj_ba(x).view(num_tokens, self.num_k_heads, 2 * group)
        q, k, v, z = qkvz.split((self.head_k_dim, self.head_k_dim, group * self.head_v_dim,
                                 group * self.head_v_dim), dim=-1)
        b, a = ba.split((group, group), dim=-1)
        return (q.reshape(num_tokens, -1), k.reshape(num_tokens, -1), v.reshape(num_tokens, -1),
                z.reshape(num_tokens, -1), b.reshape(num_tokens, -1), a.reshape(num_tokens, -1))

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache, plan) -> torch.Tensor:
        # x: (num_tokens, hidden_size); plan["linear"]: this step's AttentionMetadata
        meta = plan["linear"]
        q, k, v, z, b, a = self.split_projections(x)
        mixed = torch.cat((q, k, v), dim=-1)  # (T, conv_dim)
        conv_states = kv_cache.conv_states[self.layer_idx]  # (num_slots, conv_dim, K - 1)
        ssm_states = kv_cache.recurrent_states[self.layer_idx]  # (num_slots, Hv, dk, dv) float32
        weight = self.conv1d.weight.view(self.conv_dim, self.kernel)
        beta = b.float().sigmoid()  # (T, Hv)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # log decay
        out = torch.empty(x.shape[0], self.num_v_heads, self.head_v_dim, dtype=torch.float32, device=x.device)
        start = 0
        for query_len, seq_len, slot in zip(meta.query_lens, meta.seq_lens_list, meta.state_slots):
            rows = slice(start, start + query_len)
            start += query_len
            fresh = seq_len == query_len  # the chunk starts the sequence: zero states
            conv_state = torch.zeros_like(conv_states[slot]) if fresh else conv_states[slot]
            window = torch.cat((conv_state, mixed[rows].t().to(conv_state.dtype)), dim=-1)  # (conv_dim, K-1+L)
            conv_states[slot] = window[:, -(self.kernel - 1):]
            conv = F.silu(F.conv1d(window.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1),
                                   groups=self.conv_dim)[0]).t()  # (L, conv_dim)
            cq, ck, cv = conv.float().split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
            state = torch.zeros_like(ssm_states[slot]) if fresh else ssm_states[slot]
            out[rows], ssm_states[slot] = self._delta_rule(cq, ck, cv, g[rows], beta[rows], state)
        core = self.norm(out.reshape(-1, self.head_v_dim).to(x.dtype), z.reshape(-1, self.head_v_dim))
        return self.out_proj(core.reshape(x.shape[0], self.value_dim))

    def _delta_rule(self, q, k, v, g, beta, state):
        """One sequence's chunk: q, k (L, Hk * dk), v (L, Hv * dv), g, beta (L, Hv), state
        (Hv, dk, dv) -> out (L, Hv, dv), new state."""
        num_tokens, group = q.shape[0], self.num_v_heads // self.num_k_heads
        q, k = (l2_normalize(t.view(num_tokens, self.num_k_heads, self.head_k_dim)) for t in (q, k))
        q, k = (t.repeat_interleave(group, dim=1) for t in (q, k))  # (L, Hv, dk)
        q = q * self.head_k_dim ** -0.5
        v = v.view(num_tokens, self.num_v_heads, self.head_v_dim)
        if num_tokens == 1:
            o, state = recurrent_step(q, k, v, g, beta, state.unsqueeze(0))
            return o, state[0]
        o, state = chunked_delta_rule(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.t(), beta.t(), state)
        return o.transpose(0, 1), state
