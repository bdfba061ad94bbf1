"""AttentionMetadata: what one step's attention needs to find its keys and values.

The runner builds it from the scheduler's output; the attention layers only read it.

Layout of a step (a "flat" batch): the new tokens of sequence i occupy rows
``query_start_loc[i] : query_start_loc[i+1]`` of input_ids/positions, and are the last
``query_lens[i]`` tokens of a context of ``seq_lens[i]`` tokens. A prefill chunk of 7 is a
query of 7; a decode is a query of 1. Nothing distinguishes the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    # slot of each new token's K/V in the paged cache: block_id * block_size + offset
    slot_mapping: torch.Tensor  # (num_tokens,) int64
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int64, cumulative query lengths
    seq_lens: torch.Tensor  # (num_seqs,) int64, context length after this step
    block_tables: torch.Tensor  # (num_seqs, max_blocks_per_seq) int64, padded with 0
    # host copies, so that attention never syncs to read a length
    query_lens: list[int]
    seq_lens_list: list[int]
    block_size: int
    # per sequence: its state slot (linear-attention layers, cache/blocks.py); None without them
    state_slots: list[int] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_list)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def one_sequence_metadata(start: int, num_tokens: int, num_blocks: int, block_size: int = 16) -> AttentionMetadata:
    """One sequence whose slots are its positions (blocks 0, 1, 2, ... in order): for tests
    and benchmarks that drive the model without an engine."""
    slots = torch.arange(start, start + num_tokens, dtype=torch.int64)  # (num_tokens,)
    return AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int64),
        seq_lens=torch.tensor([start + num_tokens], dtype=torch.int64),
        block_tables=torch.arange(num_blocks, dtype=torch.int64).unsqueeze(0),  # (1, num_blocks)
        query_lens=[num_tokens], seq_lens_list=[start + num_tokens], block_size=block_size,
    )


def verification_metadata(start: int, num_tokens: int, num_blocks: int, block_size: int = 16) -> AttentionMetadata:
    """One sequence's ``num_tokens`` new tokens laid out as the runner lays out a speculative
    verification: one-token rows, row j a query of 1 over the context through its own
    position (``start + j + 1`` keys), all rows sharing the sequence's block table, so each
    row's attention is a decode's. Slots as ``one_sequence_metadata``'s."""
    slots = torch.arange(start, start + num_tokens, dtype=torch.int64)  # (num_tokens,)
    seq_lens = list(range(start + 1, start + num_tokens + 1))
    return AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.arange(num_tokens + 1, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        block_tables=torch.arange(num_blocks, dtype=torch.int64).unsqueeze(0).expand(num_tokens, -1).contiguous(),
        query_lens=[1] * num_tokens, seq_lens_list=seq_lens, block_size=block_size,
    )
