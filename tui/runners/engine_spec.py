"""What the app's engine is built from: its settings as plain picklable values, so the child
process (``tui.runners.child``) can build the engine and its runner on its side, and the app can
draw the loading frame before any torch is imported."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tinyllm.config import DEFAULT_SLOTS, EngineConfig
from tinyllm.model.config import default_kv_blocks
from tinyllm.observe.snapshot import EngineSnapshot, KVView
from tinyllm.slo import SLO
from tui.runners.interface import Frame

if TYPE_CHECKING:
    from tui.runners.frames import FrameMerger


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to build the app's engine, as plain picklable values: the checkpoint,
    the engine's settings (one EngineConfig: a new setting needs nothing here) and what the run
    writes."""

    model_dir: str
    config: EngineConfig = EngineConfig()
    record: str | None = None  # --record: write the run to this JSONL file as it happens
    slo: str | None = None  # --slo: the run's SLO, in a --record file's header (its verdicts judged by it)

    @property
    def device(self) -> str | None:
        return self.config.device  # None: cuda when available, else cpu (decided in the child)

    @property
    def threads(self) -> int | None:
        return self.config.threads  # torch CPU threads (None: torch's default)

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
        generator = torch.Generator(device=device).manual_seed(self.config.seed or 0)
        engine = ContinuousEngine(model, config=self.config, generator=generator)
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
        cfg = self.config
        # (with a KV budget what it buys is known once the model is: the cap, or DEFAULT_SLOTS, till then)
        max_len, slots, block = max_len or cfg.max_len or 0, cfg.max_num_seqs or DEFAULT_SLOTS, cfg.block_size
        if cfg.kv == "paged":
            n = cfg.kv_blocks or default_kv_blocks(slots, max_len, block)
            kv = KVView.empty("paged", n * block, block_size=block, n_blocks=n, free_blocks=n, block_owner=(None,) * n)
        else:
            kv = KVView.empty("slots", slots * max_len)
        budget = cfg.budget if cfg.chunked_prefill else None
        return Frame.loading(
            EngineSnapshot.empty(kv, slots, max_len, max_batched_tokens=budget, policy=cfg.scheduling_policy)
        )
