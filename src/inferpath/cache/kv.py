"""The paged KV cache tensors: written by slot, read by block table.

Per layer one K and one V tensor of shape (num_blocks, block_size, num_kv_heads,
head_dim). A token's slot is ``block_id * block_size + offset``; which block ids belong to
which sequence is the block manager's business (cache/blocks.py, no torch), and the runner
turns its answer into slot mappings and block tables.

Size per token is the seed's formula, 2 x layers x kv_heads x head_dim x dtype_bytes
(e.g. 327,680 bytes for Llama-3-70B in bf16).
"""

from __future__ import annotations

import torch

from inferpath.config import ModelConfig


class KVCache:
    """K and V caches of every layer, allocated once, zero-filled.

    Invariants: ``k_caches[i].shape == v_caches[i].shape == (num_blocks, block_size,
    num_kv_heads, head_dim)`` (MLA: k_caches hold (num_blocks, block_size, 1, kv_lora_rank +
    qk_rope_head_dim) latents, v_caches are empty); ``num_bytes == bytes_per_token * block_size * num_blocks``
    and equals the real allocation. Zero-filled so that padded (masked) slots never hold
    NaN, which would leak through a masked softmax's 0 * value.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 num_state_slots: int | None = None) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"KVCache needs num_blocks > 0 and block_size > 0, got {num_blocks} and {block_size}")
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        v_shape = shape
        if config.is_mla:  # a block holds latents: [latent, RoPE key] per token, no V (model/mla.py)
            shape = (num_blocks, block_size, 1, config.kv_lora_rank + config.qk_rope_head_dim)
            v_shape = (num_blocks, block_size, 1, 0)
        empty = (num_blocks, block_size, config.num_kv_heads, 0)  # linear-attention layers cache no K/V

        def of_layer(i: int, layer_shape: tuple[int, ...]) -> torch.Tensor:
            linear = config.is_linear_attention_layer(i)
            return torch.zeros(empty if linear else layer_shape, dtype=dtype, device=self.device)

        self.k_caches = [of_layer(i, shape) for i in range(config.num_layers)]
        self.v_caches = [of_layer(i, v_shape) for i in range(config.num_layers)]
        self.num_state_slots = 0
        self.conv_states: list[torch.Tensor | None] = [None] * config.num_layers
        self.recurrent_states: list[torch.Tensor | None] = [None] * config.num_layers
        if config.num_linear_layers:
            self._add_states(config, 8 if num_state_slots is None else num_state_slots)

    def _add_states(self, config: ModelConfig, num_slots: int) -> None:
        """Linear-attention layers: no K/V (empty tensors), a state slot per running sequence
        instead: the convolution's last inputs (the cache dtype) and the delta-rule
        matrices (float32, as the recurrence runs), for ``num_slots`` sequences."""
        from inferpath.config_kinds import linear_conv_dim

        if num_slots <= 0:
            raise ValueError(f"a model with linear-attention layers needs num_state_slots > 0, got {num_slots}")
        self.num_state_slots = num_slots
        conv = (num_slots, linear_conv_dim(config), config.linear_conv_kernel_dim - 1)
        delta = (num_slots, config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
        for i in range(config.num_layers):
            if config.is_linear_attention_layer(i):
                self.conv_states[i] = torch.zeros(conv, dtype=self.dtype, device=self.device)
                self.recurrent_states[i] = torch.zeros(delta, dtype=torch.float32, device=self.device)

    @property
    def state_bytes(self) -> int:
        """Bytes of every state slot (0 without linear-attention layers)."""
        return sum(t.nbytes for t in (*self.conv_states, *self.recurrent_states) if t is not None)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def bytes_per_token(self) -> int:
        return self.config.kv_bytes_per_token(_dtype_bytes(self.dtype))

    @property
    def num_bytes(self) -> int:
        return sum(t.nbytes for t in self.k_caches) + sum(t.nbytes for t in self.v_caches)

    @staticmethod
    def num_blocks_for_budget(config: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int) -> int:
        """How many blocks fit in ``budget_bytes``; raises if not even one does."""
        bytes_per_block = config.kv_bytes_per_token(_dtype_bytes(dtype)) * block_size
        num_blocks = budget_bytes // bytes_per_block
        if num_blocks < 1:
            raise ValueError(
                f"KV cache budget of {budget_bytes} bytes holds no block: one block of {block_size} "
                f"tokens needs {bytes_per_block} bytes; raise the budget"
            )
        return int(num_blocks)

    def __repr__(self) -> str:
        return (f"KVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, dtype={self.dtype}, "
                f"bytes_per_token={self.bytes_per_token}, num_bytes={self.num_bytes})")


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
