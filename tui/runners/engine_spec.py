"""What the app's engine is built from: its settings as plain picklable values, so the child
process (``tui.runners.child``) can build the engine and its runner on its side, and the app can
draw the loading frame before any torch is imported."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tinyllm.config import EngineConfig
from tinyllm.model.config import default_kv_blocks
from tinyllm.observe.snapshot import EngineSnapshot, KVView
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS
from tinyllm.slo import SLO
from tui.runners.interface import Frame

if TYPE_CHECKING:
    from tui.runners.frames import FrameMerger


# The fields an EngineConfig takes from the spec unchanged (its name for each is the spec's).
CONFIG_AS_IS = (
    "kv max_len kv_memory_mib chunked_prefill prefix_cache scheduling_policy kv_cache_dtype device threads seed".split()
)


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to build the engine, as plain picklable values."""

    model_dir: str
    device: str | None = None  # None: cuda when available, else cpu (decided in the child)
    slots: int = 8
    max_len: int | None = None
    kv: str = "slots"
    block_size: int = 16
    kv_blocks: int | None = None
    seed: int = 0
    threads: int | None = None  # torch CPU threads (None: torch's default)
    chunked_prefill: bool = False  # the token-budget scheduler (kv="paged" only)
    max_batched_tokens: int | None = None
    prefix_cache: bool | None = None  # None: on with chunked prefill
    record: str | None = None  # --record: write the run to this JSONL file as it happens
    scheduling_policy: str = "fcfs"  # the waiting queue's order (tinyllm/engine/policy.py)
    kv_memory_mib: float | None = None  # --kv-memory: the KV budget sizes the cache (slots is then unused)
    max_num_seqs: int | None = None  # with a budget: the cap on running requests (None: the engine's default)
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype: the KV cache's element type (ContinuousEngine)
    slo: str | None = None  # --slo: the run's SLO, in a --record file's header (its verdicts judged by it)

    def config(self) -> EngineConfig:
        """The engine's settings (a block pool's only for kv="paged"; with a KV budget the budget
        sizes the cache and ``max_num_seqs`` caps the sequences, ``slots`` unused)."""
        paged = dict(block_size=self.block_size, kv_blocks=self.kv_blocks) if self.kv == "paged" else {}
        chunked = dict(max_batched_tokens=self.max_batched_tokens) if self.chunked_prefill else {}
        cap = self.max_num_seqs if self.kv_memory_mib else self.slots
        same = {name: getattr(self, name) for name in CONFIG_AS_IS}
        return EngineConfig(max_num_seqs=cap, **same, **paged, **chunked)

    def build(self):
        """Load the checkpoint and build the engine: (ContinuousEngine, Tokenizer). Raises
        CheckpointError or ValueError with a message meant for the user."""
        import torch

        from tinyllm.engine import ContinuousEngine
        from tinyllm.model.checkpoint import load_checkpoint
        from tinyllm.model.device import resolve_device

        if self.threads:
            torch.set_num_threads(self.threads)
        device = resolve_device(self.device)
        model, tok = load_checkpoint(self.model_dir, device=device)
        engine = ContinuousEngine(
            model, config=self.config(), generator=torch.Generator(device=device).manual_seed(self.seed)
        )
        return engine, tok

    def open_recorder(self, engine):
        """The --record file's writer (None without --record); OSError if it cannot be written."""
        if not self.record:
            return None
        from tui.runners.frames import FrameRecorder, settings_of

        slo = SLO.parse(self.slo) if self.slo else None
        return FrameRecorder(
            self.record, engine.snapshot(), Path(self.model_dir).name, self.model_dir, settings_of(self), slo
        )

    def start_runner(self, paused: bool, step_delay_ms: int):
        """In the child process: build the engine and its runner; (runner, (device, threads))."""
        import torch

        from tui.runners.engine import EngineRunner  # (the child's side: the runner and its loop)

        engine, tok = self.build()
        runner = EngineRunner(
            engine, tok, paused=paused, step_delay_ms=step_delay_ms, recorder=self.open_recorder(engine)
        )
        return runner, (engine.device.type, torch.get_num_threads())

    @staticmethod
    def encoder() -> Callable[[Frame], Frame]:
        """Child side: frames travel as deltas (only what changed since the last one sent)."""
        from tui.runners.frames import FrameDiffer

        return FrameDiffer().delta

    @staticmethod
    def decoder() -> FrameMerger:
        from tui.runners.frames import FrameMerger

        return FrameMerger()

    def loading_frame(self, max_len: int | None = None) -> Frame:
        """What the app shows while the engine loads: the right grid of free slots (and free
        blocks), no requests, status "loading". Needs no torch and no weights."""
        max_len = max_len or self.max_len or 0
        if self.kv == "paged":
            n = self.kv_blocks or default_kv_blocks(self.slots, max_len, self.block_size)
            kv = KVView.empty(
                "paged",
                n * self.block_size,
                block_size=self.block_size,
                n_blocks=n,
                free_blocks=n,
                block_owner=(None,) * n,
            )
        else:
            kv = KVView.empty("slots", self.slots * max_len)
        budget = (self.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS) if self.chunked_prefill else None
        return Frame.loading(
            EngineSnapshot.empty(kv, self.slots, max_len, max_batched_tokens=budget, policy=self.scheduling_policy)
        )
