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
                slot=s,
                rid=q.rid if q is not None else None,
                context_len=lens[s] if q is not None else 0,
                capacity=self.max_len,
                blocks=tuple(tables[s]),
                just_admitted=s in self._just_admitted,
                prefill_left=q.remaining() if chunked and q is not None and not q.prefilled else 0,
            )
            for s, q in enumerate(self._slot_seq)
        )
        reqs = tuple(q.snapshot_view() for q in self._seqs.values())
        kv = KVView(
            kind=self.kv_kind,
            reserved_tokens=slots.reserved_tokens(),
            allocated_tokens=slots.allocated_tokens(),
            used_tokens=slots.used_tokens(),
            bytes_per_token=self.stats.kv_bytes_per_token,
            dtype=self._kv_dtype_name,
        )
        if self.kv_kind == "paged":
            owner_slot = slots.block_owners()
            owners = tuple(
                self._slot_seq[o].rid if o is not None and self._slot_seq[o] is not None else None for o in owner_slot
            )
            kv = KVView(
                kind=kv.kind,
                reserved_tokens=kv.reserved_tokens,
                allocated_tokens=kv.allocated_tokens,
                used_tokens=kv.used_tokens,
                bytes_per_token=kv.bytes_per_token,
                block_size=slots.block_size,
                n_blocks=slots.n_blocks,
                free_blocks=slots.num_free_blocks(),
                block_owner=owners,
                block_refs=tuple(slots.ref),
                block_cached=tuple(k is not None for k in slots.block_key) if self.prefix_cache else (),
                cached_free_blocks=slots.cached_free_blocks(),
                dtype=kv.dtype,
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
            spec_drafts=st.spec_drafts,
            spec_draft_tokens=st.spec_draft_tokens,
            spec_accepted_tokens=st.spec_accepted_tokens,
            spec_accepted_per_pos=tuple(st.spec_accepted_per_pos),
        )
        return EngineSnapshot(
            time_s=self.now(),
            n_slots=self.n_slots,
            max_len=self.max_len,
            slots=slot_views,
            requests=reqs,
            queue=tuple(q.rid for q in self.waiting),
            kv=kv,
            counters=counters,
            max_batched_tokens=self.max_batched_tokens,
            policy=self.policy,
            batch=self._batch,
            speculative=getattr(self.scheduler, "spec_tokens", 0),
            speculative_off=getattr(self.scheduler, "spec_off_now", False),
            speculative_error=getattr(self.scheduler, "proposer_error", ""),
            speculative_method=self.scheduler.proposer.method if hasattr(self.scheduler, "proposer") else "ngram",
        )
