"""Model runner: a SchedulerOutput in, one sampled token (or a row's error) per
finishing chunk out, as a RunnerOutput (engine/outputs.py).

The only part of the engine that touches tensors. It lays the step's chunks out as one
flat batch (design.md):

    input_ids, positions, slot_mapping   (num_tokens,)    the new tokens, back to back
    query_start_loc                      (num_seqs + 1,)  where each chunk starts
    seq_lens                             (num_seqs,)      context length after the step
    block_tables                         (num_seqs, max_blocks) padded with block 0
    logits_indices                       (num_samples,)   last row of each sampling chunk
                                                          (every drafted position's row, and
                                                          the one before, for a speculative one)

runs ``model.forward``, the LM head on ``logits_indices`` only, and the sampler. Under
``deterministic_seeded`` a step holding seeded and other requests is two such forwards, one
batch-invariant (engine/row_passes.py), and one sampler call. With a
``DecodeThreadTuner`` (threads.py) a step that decodes one sequence runs at the tuner's
thread count and reports its time to it; every other step runs at the configured count.

NOTE: host overhead is per step, not per token where it can be helped: three
``torch.tensor`` calls per step (the token-indexed fields, the sequence-indexed ones, the
block tables) and views into them; slot mappings are built one range per block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from inferpath.cache.blocks import BlockManager
from inferpath.cache.kv import KVCache
from inferpath.engine.outputs import RunnerOutput
from inferpath.engine.prompt_logprobs import PromptLogprobsPlan
from inferpath.engine.row_passes import PassJoin, split_passes
from inferpath.engine.scheduler import SchedulerOutput
from inferpath.model.batch_invariant import row_invariant_dispatch
from inferpath.model.metadata import AttentionMetadata
from inferpath.sampling.rejection import DraftRows, verify_drafts
from inferpath.sampling.sampler import Sampler, SamplingRow
from inferpath.threads import DecodeThreadTuner, sampling_threads, set_thread_count


@dataclass
class BatchInputs:
    """The step's tensors (see the module docstring), and what to sample."""

    input_ids: torch.Tensor  # (num_tokens,)
    positions: torch.Tensor  # (num_tokens,)
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # (num_samples,)
    sampling_rows: list[SamplingRow]
    prompt_logprobs: PromptLogprobsPlan | None = None  # rows scoring prompt tokens, if asked
    # per sampling chunk, what to verify (sampling/rejection.py); None: no chunk has drafts
    drafts: list[DraftRows] | None = None


class ModelRunner:
    """Owns the model, its KV cache and the sampler; executes one step at a time."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, block_manager: BlockManager,
                 sampler: Sampler, eos_token_ids: frozenset[int], device: str | torch.device = "cpu",
                 thread_tuner: DecodeThreadTuner | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.device = torch.device(device)
        self.thread_tuner = thread_tuner
        self.last_passes: list = []  # the last step's RowPass list (engine/row_passes.py)

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        tuner = self.thread_tuner
        if tuner is None or scheduled.is_empty:
            return self._execute(scheduled)
        # a row-invariant request runs at the configured count (its bits stay put)
        one_decode = (len(scheduled.chunks) == 1 and scheduled.chunks[0].num_new_tokens == 1
                      and not scheduled.chunks[0].request.row_invariant)
        set_thread_count(tuner.next_count() if one_decode else tuner.configured)
        start = time.perf_counter()
        output = self._execute(scheduled)
        if one_decode:
            tuner.observe(time.perf_counter() - start)
        return output

    @torch.inference_mode()
    def _execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        if scheduled.is_empty:
            return RunnerOutput([], [])
        # seeded requests under deterministic_seeded run as a sub-batch of their own
        passes = split_passes(scheduled.chunks, getattr(self.model, "batch_invariant", False))
        self.last_passes = passes
        if len(passes) == 1:
            batch, logits = self._forward(scheduled, passes[0].invariant)
            rows, drafts, join = batch.sampling_rows, batch.drafts, None
        else:
            parts = [self._forward(replace(scheduled, chunks=p.chunks), p.invariant) for p in passes]
            rows, drafts = PassJoin.rows([batch for batch, _ in parts]), None
            logits = PassJoin.logits([part_logits for _, part_logits in parts]) if rows else None
            join = PassJoin(scheduled.chunks, passes)
        if not rows:
            return RunnerOutput([], [])
        with sampling_threads(logits.numel()):  # few logits: on this thread (threads.py)
            if drafts is not None:  # speculative chunks: accept a prefix of each one's drafts
                output = verify_drafts(self.sampler, logits, rows, drafts)
            else:
                sampled = self.sampler(logits, rows)  # logits: (num_samples, vocab)
                output = RunnerOutput(sampled.token_ids, sampled.logprobs, sampled.errors)
        return output if join is None else join.to_step_order(output)

    def _forward(self, scheduled: SchedulerOutput, invariant: bool) -> tuple[BatchInputs, torch.Tensor | None]:
        """One forward of the scheduled chunks: their inputs, and the logits of their
        sampling rows (None when none samples). ``invariant``: every linear and attention
        row computed the same way whatever the batch (model/batch_invariant.py)."""
        batch = self.prepare(scheduled)
        with row_invariant_dispatch(invariant):
            hidden = self.model(batch.input_ids, batch.positions, self.kv_cache, batch.meta)
            # hidden: (num_tokens, hidden_size); logits only where a token is sampled
            if batch.prompt_logprobs is not None:
                batch.prompt_logprobs.score(self.model, hidden)  # appends to the requests' lists
            if not batch.sampling_rows:
                return batch, None
            return batch, self.model.compute_logits(hidden.index_select(0, batch.logits_indices))

    def prepare(self, scheduled: SchedulerOutput) -> BatchInputs:
        """Lay the scheduled chunks out as one flat batch of tensors."""
        bs = self.block_manager.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logits_indices: list[int] = []
        rows: list[SamplingRow] = []
        drafts: list[DraftRows] = []
        prompt_plan = PromptLogprobsPlan()
        states = [] if self.block_manager.num_state_slots else None  # linear-attention layers' slots
        for chunk in scheduled.chunks:
            request = chunk.request
            start, end = chunk.start, chunk.end
            table = self.block_manager.block_table(request.seq_id)
            num_drafts = len(chunk.draft_token_ids)
            input_ids += request.all_token_ids[start:end - num_drafts]
            input_ids += chunk.draft_token_ids
            positions += range(start, end)
            pos = start
            while pos < end:  # one range per block the chunk touches
                block_end = min(end, (pos // bs + 1) * bs)
                base = table[pos // bs] * bs - (pos // bs) * bs
                slots += range(base + pos, base + block_end)
                pos = block_end
            prompt_plan.add_chunk(request, start, end, query_start_loc[-1])
            # NOTE: a verification is laid out as 1 + k one-token rows of the sequence (row j
            # attends to the keys through its own position, all written before attention), so
            # each row's attention is a decode's, in the decode kernel, and its logits are the
            # bits a plain decode at that position gets wherever the matmul's rows are
            # independent (repacked weights up to 8 rows): greedy identity past near ties
            verification = num_drafts and end - start == 1 + num_drafts and states is None
            ends = range(start + 1, end + 1) if verification else (end,)
            for row_start, row_end in zip((start, *ends[:-1]), ends):
                query_lens.append(row_end - row_start)
                query_start_loc.append(query_start_loc[-1] + row_end - row_start)
                seq_lens.append(row_end)
                tables.append(table)
            if states is not None:
                states.append(self.block_manager.state_slot(request.seq_id))
            if chunk.samples:
                # a speculative chunk samples at its last real token and at every draft, each
                # row seeing the drafts before it as output (penalties, min_tokens)
                first_row = len(rows)
                grammar = request.grammar  # row j's matcher: the grammar after drafts[:j]
                grammars = (grammar.along(chunk.draft_token_ids) if grammar is not None
                            else [None] * (num_drafts + 1))
                for j in range(num_drafts + 1):
                    logits_indices.append(query_start_loc[-1] - 1 - num_drafts + j)
                    output_ids = (request.output_token_ids if j == 0 else
                                  request.output_token_ids + list(chunk.draft_token_ids[:j]))
                    rows.append(SamplingRow(request.params, request.prompt_token_ids,
                                            output_ids, request.generator,
                                            self.eos_token_ids, grammars[j], request.row_invariant))
                probs = request.spec_draft_probs
                drafts.append(DraftRows(first_row, chunk.draft_token_ids,
                                        None if probs is None or not num_drafts else probs[:num_drafts]))
        num_tokens = len(input_ids)
        num_seqs = len(query_lens)
        # one host-to-tensor conversion per index space
        per_token = torch.tensor(input_ids + positions + slots, dtype=torch.long)
        max_blocks = -(-max(seq_lens) // bs)
        padded = [t[:max_blocks] + [0] * (max_blocks - len(t[:max_blocks])) for t in tables]
        per_seq = torch.tensor(query_start_loc + seq_lens + logits_indices, dtype=torch.long)
        block_tables = torch.tensor(padded, dtype=torch.long)
        if self.device.type != "cpu":
            per_token, per_seq = per_token.to(self.device), per_seq.to(self.device)
            block_tables = block_tables.to(self.device)
        meta = AttentionMetadata(
            slot_mapping=per_token[2 * num_tokens:],
            query_start_loc=per_seq[:num_seqs + 1],
            seq_lens=per_seq[num_seqs + 1:2 * num_seqs + 1],
            block_tables=block_tables,
            query_lens=query_lens,
            seq_lens_list=seq_lens,
            block_size=bs,
            state_slots=states,
        )
        return BatchInputs(per_token[:num_tokens], per_token[num_tokens:2 * num_tokens], meta,
                           per_seq[2 * num_seqs + 1:], rows, prompt_plan if prompt_plan.rows else None,
                           drafts if any(d.draft_token_ids for d in drafts) else None)
