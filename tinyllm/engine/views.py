"""What viewers read of a ContinuousEngine: its immutable snapshot.

A part of ContinuousEngine (a mixin: it reads the engine's own state, changes nothing but the
per-request view cache).
"""

from __future__ import annotations

from tinyllm.observe.snapshot import Counters, EngineSnapshot, KVView, SlotView


class EngineViews:
    """ContinuousEngine.snapshot."""

    def snapshot(self) -> EngineSnapshot:
        """Plain immutable state for viewers. O(slots + blocks + requests); unchanged requests
        reuse their cached views, so token tuples are rebuilt only for requests that moved."""
        slots = self.slots
        lens = slots.context_lens()
        tables = slots.block_tables() if self.kv_kind == "paged" else [()] * self.n_slots  # (slots: one block each)
        chunked = self.chunked_prefill
        slot_views = tuple(
            SlotView(
                s,
                q.rid if q is not None else None,
                lens[s] if q is not None else 0,
                self.max_len,
                tuple(tables[s]),
                s in self._just_admitted,
                q.remaining() if chunked and q is not None and not q.prefilled else 0,
            )
            for s, q in enumerate(self._slot_seq)
        )
        reqs = tuple(q.snapshot_view() for q in self._seqs.values())
        kv = KVView(
            self.kv_kind,
            slots.reserved_tokens(),
            slots.allocated_tokens(),
            slots.used_tokens(),
            self.stats.kv_bytes_per_token,
            dtype=self._kv_dtype_name,
        )
        if self.kv_kind == "paged":
            owner_slot = slots.block_owners()
            owners = tuple(
                self._slot_seq[o].rid if o is not None and self._slot_seq[o] is not None else None for o in owner_slot
            )
            kv = KVView(
                kv.kind,
                kv.reserved_tokens,
                kv.allocated_tokens,
                kv.used_tokens,
                kv.bytes_per_token,
                slots.block_size,
                slots.n_blocks,
                slots.num_free_blocks(),
                owners,
                tuple(slots.ref),
                tuple(k is not None for k in slots.block_key) if self.prefix_cache else (),
                slots.cached_free_blocks(),
                kv.dtype,
            )
        st = self.stats
        counters = Counters(
            steps=self._steps,
            decode_steps=st.decode_steps,
            prefills=self._prefills,
            prefill_tokens=self.stats.prefill_tokens,
            preemptions=st.preemptions,
            peak_active=st.peak_active,
            useful_tokens=st.useful_tokens,
            generated_tokens=self._generated,
            finished=self._finished,
            aborted=self._aborted,
            failed=self._failed,
            prefix_queries=self._prefix_queries,
            prefix_hits=self._prefix_hits,
            computed_rows=st.computed_rows,
            useful_rows=st.useful_rows,
        )
        return EngineSnapshot(
            self.now(),
            self.n_slots,
            self.max_len,
            slot_views,
            reqs,
            tuple(q.rid for q in self.waiting),
            kv,
            counters,
            self.max_batched_tokens,
            self.policy,
            self._batch,
        )
