"""The commit of a step: a forward's outcome (sampled tokens) made the requests' state.

A part of ContinuousEngine (a mixin: it reads and changes the engine's own state). Every step
is plan -> forward -> commit; this module is the last third, per kind of forward (a padded
prefill, a slot decode, a ragged mixed batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.engine.forward import Prefilled
from tinyllm.engine.sampler import Row, Sampled, sample_batch, target_probs
from tinyllm.engine.scheduler import StepPlan
from tinyllm.engine.sequence import Event, Sequence, finish_reason
from tinyllm.engine.speculate import count_verified


class Commits:
    """How each kind of forward pass is committed."""

    def _commit(self, plan: StepPlan, out: Tensor | Prefilled) -> list[Event]:
        return self._commit_prefill(plan, out) if plan.kind == "prefill" else self._commit_mixed(plan, out)

    def _commit_prefill(self, plan: StepPlan, out: Tensor | Prefilled) -> list[Event]:
        """Prefilled requests take their slots (their K/V is there; the CUDA-graph path's is
        moved in from its scratch cache); their first tokens as Events."""
        self._prefills += 1
        self.stats.prefill_tokens += plan.tokens
        logits = out.logits if isinstance(out, Prefilled) else out
        sampled = sample_batch(logits, [seq.row() for seq, _, _ in plan.items], self.generator)
        nxt, failed = sampled.tokens, sampled.failed
        if isinstance(out, Prefilled):
            self.slots.admit(plan.slots, out.cache, out.pad)
            self.runner.last_tok[torch.tensor(plan.slots, device=self.device)] = nxt
        toks = nxt.squeeze(-1).tolist()
        now = self.now()
        events = []
        for i, ((seq, _, n), s, t) in enumerate(zip(plan.items, plan.slots, toks)):
            self._seat(seq, s, n)
            self._note("prefill", seq, s, n, f"0..{n} of {n}")  # the whole context, in this one step
            if i in failed:
                self._fail(seq, failed[i])
            else:
                events.append(self._record(seq, t, now, sampled.logprobs.get(i)))
        return events

    def _commit_decode(self, plan: StepPlan, logits: Tensor) -> list[Event]:
        """One sampled token per slot (idle rows with the engine's default, then dropped); on the
        paged pool, one per running sequence, in the plan's order."""
        if not self.runner.every_slot:
            seqs = [seq for seq, _, _ in plan.items]
            return self._emit(list(enumerate(seqs)), sample_batch(logits, [q.row() for q in seqs], self.generator))
        rows = [q.row() if q is not None else Row(self.sampling) for q in self._slot_seq]
        sampled = sample_batch(logits, rows, self.generator)
        self.runner.last_tok = sampled.tokens
        return self._emit([(seq.slot, seq) for seq, _, _ in plan.items], sampled)

    def _commit_mixed(self, plan: StepPlan, logits: Tensor) -> list[Event]:
        """After a ragged forward: each item's progress, prefill events, sampled tokens (a
        speculative draft's item: its verification, ``_commit_draft``)."""
        samplers, at, drafts = [], [], []
        self.stats.computed_rows += len(plan.items)
        self.stats.useful_rows += len(plan.items)
        pool, prefix_cache = self.slots, self.prefix_cache
        row = 0  # the logits row of the next item that samples
        for seq, start, n in plan.items:  # (per item per step: kept lean)
            if seq.draft:
                drafts.append((seq, start, row))
                row += n
                continue
            done = seq.computed = start + n
            total = len(seq.req.prompt) + len(seq.out)
            if not seq.prefilled:
                self._prefills += 1
                self.stats.prefill_tokens += n
                self._note("prefill", seq, seq.slot, n, f"{start}..{done} of {total}")
            if prefix_cache and done // pool.block_size > len(pool.slot_keys[seq.slot]):
                pool.register_full(seq.slot, seq.context())  # newly full blocks join the cache
            if done == total:
                samplers.append(seq)
                at.append(row)
                row += 1
        events = [
            ev for seq, start, r in drafts for ev in self._commit_draft(seq, start, logits[r : r + 1 + len(seq.draft)])
        ]
        if not samplers:
            return events
        for i, seq in enumerate(list(samplers)):
            if seq.forks:  # its prompt is computed: its samples fork off
                forked = self._fork(seq)
                samplers += forked
                at += [at[i]] * len(forked)
        if at != list(range(logits.size(0))):  # (every step without drafts or forks: the rows as they are)
            logits = logits[torch.tensor(at, device=logits.device)]
        sampled = sample_batch(logits, [q.row() for q in samplers], self.generator)
        for seq in samplers:
            seq.prefilled = True  # sampled since its (re)admission
        return events + self._emit(list(enumerate(samplers)), sampled)

    def _commit_draft(self, seq: Sequence, start: int, logits: Tensor) -> list[Event]:
        """A speculative draft verified (engine/speculate.py): the model's token at each position
        (its argmax: drafted requests are greedy), the draft's longest prefix that agrees kept,
        then the model's own next token; the rejected tail's K/V rolled back."""
        draft, seq.draft = seq.draft, []
        verified = self._verify_greedy if seq.row().argmax_only else self._verify_sampled
        try:
            a, own = verified(seq, draft, logits)
        except ValueError as e:  # no distribution (NaN or inf logits): the request fails, as without drafts
            self.slots.trim(seq.slot, start + 1)
            seq.computed = start + 1
            self._fail(seq, str(e))
            return []
        count_verified(self.stats, len(draft), a)
        seq.spec_drafted += len(draft)
        seq.spec_kept += a
        seq.spec_drafts += 1
        seq.last_draft = (self._steps, len(draft), a)
        seq.computed = start + 1 + a  # the newest token and the accepted drafts: their K/V is kept
        self.slots.trim(seq.slot, seq.computed)
        if self.prefix_cache and seq.computed // self.slots.block_size > len(self.slots.slot_keys[seq.slot]):
            self.slots.register_full(seq.slot, [*seq.context(), *draft[:a]])
        seq.prefilled = True
        now, events = self.now(), []
        for tok in [*draft[:a], own]:
            ev = self._record(seq, tok, now)
            events.append(ev)
            if ev.done:  # its EOS, a stop token or max_new_tokens: nothing after it counts
                break
        return events

    def _verify_greedy(self, seq: Sequence, draft: list[int], logits: Tensor) -> tuple[int, int]:
        """(drafts kept, the token after them): the model's argmax at each position; the draft's
        longest prefix that agrees is kept."""
        sampled = sample_batch(logits, [seq.row()] * logits.size(0), self.generator)
        if sampled.failed:
            raise ValueError(next(iter(sampled.failed.values())))
        model = sampled.tokens.squeeze(-1).tolist()
        a = 0
        while a < len(draft) and model[a] == draft[a]:
            a += 1
        return a, model[a]

    def _verify_sampled(self, seq: Sequence, draft: list[int], logits: Tensor) -> tuple[int, int]:
        """(drafts kept, the token after them) by rejection sampling, which keeps the request's
        own distribution p (temperature, top_k, top_p, min_p) at every position: draft token d is
        kept with probability p(d) (the draft proposes it with certainty); the first one rejected
        is replaced by a draw from p without d, renormalised; all kept, the next token is drawn
        from p at the position after them (Leviathan et al., 2023; vLLM's rejection sampler)."""
        probs = target_probs(logits, seq.row())
        if not torch.isfinite(probs).all() or (probs.sum(-1) <= 0).any():
            raise ValueError("sampling failed: the row's probabilities are not a distribution (NaN or inf logits)")
        g = self.generator
        u = torch.rand(len(draft), dtype=torch.float64, generator=g, device=probs.device).tolist()
        for i, d in enumerate(draft):
            if u[i] < probs[i, d].item():
                continue
            rest = probs[i].clone()
            rest[d] = 0.0
            return i, int(torch.multinomial(rest / rest.sum(), 1, generator=g).item())
        return len(draft), int(torch.multinomial(probs[len(draft)], 1, generator=g).item())

    def _emit(self, rows: list[tuple[int, Sequence]], sampled: Sampled) -> list[Event]:
        """Each (row, seq) gets row's sampled token, or fails if sampling that row failed."""
        toks = sampled.tokens.squeeze(-1).tolist()
        now = self.now()
        if not sampled.failed:  # (every step but a broken one)
            record, logprobs = self._record, sampled.logprobs
            return [record(seq, toks[row], now, logprobs.get(row) if logprobs else None) for row, seq in rows]
        events = []
        for row, seq in rows:
            if row in sampled.failed:
                self._fail(seq, sampled.failed[row])
            else:
                events.append(self._record(seq, toks[row], now, sampled.logprobs.get(row)))
        return events

    def _record(self, seq: Sequence, tok: int, now: float, lp=None) -> Event:
        seq.out.append(tok)
        if lp is not None:
            seq.logprobs.append(lp)
        seq.view = None
        self._generated += 1
        if len(seq.out) == 1:
            seq.first_token = now
            self._note("first_token", seq, seq.slot, 1)
        why = finish_reason(seq.req, seq.out)
        if why is not None:
            self._finished_now(seq, now, why)
        return Event(seq.rid, tok, why is not None, why or "", lp)
