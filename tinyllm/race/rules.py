"""What a workload must satisfy to be raced, checked before anything starts (no torch: the app
checks it before the engine process is up, so a bad workload is a one-line error, exit 2)."""

from __future__ import annotations

from tinyllm.request import ContextTooLong, check_fits

DEFAULT_BATCH_TIMEOUT_S = 1.0  # static batching with arrivals: how long the oldest waits for a full batch
DEFAULT_WORKLOAD = "mixed_lengths"  # short and long requests together: where static batching loses most
DEFAULT_MAX_LEN = 512  # the continuous lanes' context, as in tinyllm bench


def check_static_batches(
    sizes: list[tuple[int, int]], batch: int, max_seq_len: int, what: str = "the model's max_seq_len"
) -> None:
    """Static batching left-pads a batch to its longest prompt and decodes it to its largest
    max_new_tokens, so every run of ``batch`` consecutive requests (``sizes``: (prompt tokens,
    max_new_tokens) in arrival order: batches are cut from that order) must fit the model's
    context together. ContextTooLong says which do not."""
    for i in range(max(1, len(sizes) - batch + 1)):
        window = sizes[i : i + batch]
        L = max(p for p, _ in window)
        try:
            check_fits(L, max(n for _, n in window), max_seq_len, what)
        except ContextTooLong as e:
            raise ContextTooLong(
                f"static batching pads requests {i}..{i + len(window) - 1} to {L} prompt tokens: {e}"
            ) from None
