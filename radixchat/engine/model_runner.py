"""Runs one forward pass of an unmodified transformers model over a flattened mixed batch: the compiled decode
step where one fits, else the lean forward of a known architecture (``lean``: a pure-decode step in native code,
any other in Python), else the model itself."""

from __future__ import annotations

import torch

from radixchat.engine.attention import AttentionBatch, ExtendSeq
from radixchat.engine.batch import ScheduledBatch
from radixchat.engine.decode_graph import DecodeGraphs
from radixchat.engine.kv_pool import KVPool, ReqToTokenTable
from radixchat.engine.lean import lean_forward


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        table: ReqToTokenTable,
        *,
        paged: bool = False,
        paged_extend: bool = False,
        unified: bool = False,
        decode_graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.table = table
        self.paged = paged  # decode attention reads the pool in place (attention.paged_decode_usable)
        self.paged_extend = paged_extend  # so do prefill chunks, in bfloat16 (the fast path only)
        # Decode tokens go through the prefill kernel too (as one-token extends): every token's attention is
        # the same arithmetic, whether it is decoded or prefilled (deterministic inference).
        self.unified = unified
        self.device = pool.device
        self.decode_graphs = decode_graphs  # compiled pure-decode steps, once built
        self.lean = lean_forward(model)  # the same logits as the model's, without transformers' wrappers
        # pure-decode steps without a compiled graph run the lean forward's native decode step (the same bits)
        self.native_decode = True

    def build_metadata(self, batch: ScheduledBatch) -> tuple[AttentionBatch, torch.Tensor, torch.Tensor]:
        dev = self.device
        positions: list[int] = []
        out_rows: list[int] = []
        out_cols: list[int] = []
        for req, start, n in zip(batch.reqs, batch.starts, batch.num_new):
            positions.extend(range(start, start + n))
            out_rows.extend([req.row] * n)
            out_cols.extend(range(start, start + n))
        pos_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        table = self.table.table
        out_slots = table[torch.tensor(out_rows, device=dev), pos_t]
        unified = self.unified and self.paged_extend
        n_decode = 0 if unified else batch.n_decode
        meta = AttentionBatch(pool=self.pool, out_slots=out_slots, n_decode=n_decode, paged=self.paged)
        if n_decode:
            dec = batch.reqs[: batch.n_decode]
            lens = [s + 1 for s in batch.starts[: batch.n_decode]]
            lmax = max(lens)
            rows = torch.tensor([r.row for r in dec], device=dev)
            lens_t = torch.tensor(lens, device=dev)
            slots = table[rows, :lmax]
            meta.decode_uniform = min(lens) == lmax
            if not meta.decode_uniform:  # padding reads the dummy slot, never stale (maybe NaN) memory
                slots = slots.masked_fill(torch.arange(lmax, device=dev)[None, :] >= lens_t[:, None], 0)
            meta.decode_slots = slots
            meta.decode_lens = lens_t
        q_start = n_decode
        extends = list(zip(batch.reqs[n_decode:], batch.starts[n_decode:], batch.num_new[n_decode:]))
        if self.paged_extend and extends:
            width = max(start + n for _, start, n in extends)
            meta.extend_slots = table[torch.tensor([r.row for r, _, _ in extends], device=dev), :width]
            starts = [sum(n for _, _, n in extends[:i]) for i in range(len(extends))]
            meta.extend_q_starts = torch.tensor(starts, dtype=torch.int64)
            meta.extend_q_lens = torch.tensor([n for _, _, n in extends], dtype=torch.int64)
            meta.extend_kv_lens = torch.tensor([start + n for _, start, n in extends], dtype=torch.int64)
            return meta, pos_t, out_slots
        for req, start, n in extends:
            kv_slots = table[req.row, : start + n] if start > 0 else None
            meta.extends.append(ExtendSeq(q_start, n, start + n, kv_slots))
            q_start += n
        return meta, pos_t, out_slots

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Run the batch; return float32 logits ``[n_sampling, vocab]`` in request order."""
        meta, pos_t, out_slots = self.build_metadata(batch)
        graphs = self.decode_graphs
        graph = (
            graphs.lookup(batch.n_decode)
            if graphs is not None and batch.n_decode == len(batch.reqs)
            else None
        )
        if graph is not None:
            input_ids = torch.tensor(batch.input_ids, dtype=torch.int64, device=self.device)[None]
            assert meta.decode_slots is not None and meta.decode_lens is not None
            logits = graph(
                input_ids,
                pos_t[None],
                out_slots,
                meta.decode_slots,
                meta.decode_lens,
                self.pool.k,
                self.pool.v,
            )
            return logits[0].float()
        keep: list[int] = []
        offset = 0
        for n, samples in zip(batch.num_new, batch.samples):
            offset += n
            if samples:
                keep.append(offset - 1)
        input_ids = torch.tensor(batch.input_ids, dtype=torch.int64, device=self.device)[None]
        keep_t = torch.tensor(keep or [offset - 1], dtype=torch.int64, device=self.device)
        native = None
        if self.lean is not None and self.native_decode and len(keep) == batch.n_decode == len(batch.reqs):
            native = self.lean.decode(input_ids, pos_t[None], meta)
        if native is not None:
            logits = native[0]
        elif self.lean is not None:
            logits = self.lean(input_ids, pos_t[None], meta, keep_t)[0]
        else:
            logits = self.model(
                input_ids=input_ids,
                position_ids=pos_t[None],
                use_cache=False,
                radix=meta,
                logits_to_keep=keep_t,
            ).logits[0]
        if not keep:
            return logits[:0].float()
        return logits.float()
