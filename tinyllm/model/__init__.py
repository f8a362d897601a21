"""The model: the transformer, its config and checkpoints, the tokenizer, training, and solo
generation (the reference every batched path must equal)."""

from tinyllm.lazy import lazy_exports

# The seed's ``from tinyllm.model import Transformer``, resolved on first use: importing
# ``tinyllm.model.config`` (as the app does, which must not load torch) stays light.
__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "tinyllm.model.transformer": ("Transformer",),
        "tinyllm.model.config": ("ModelConfig",),
        "tinyllm.model.checkpoint": ("load_checkpoint",),
        "tinyllm.model.tokenizer": ("Tokenizer",),
    },
)
