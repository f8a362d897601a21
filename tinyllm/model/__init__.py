"""The model: the transformer, its config and checkpoints, the tokenizer, training, and solo
generation (the reference every batched path must equal)."""

# The seed's ``from tinyllm.model import Transformer``, resolved on first use: importing
# ``tinyllm.model.config`` (as the app does, which must not load torch) stays light.
_EXPORTS = {
    "Transformer": "tinyllm.model.transformer",
    "ModelConfig": "tinyllm.model.config",
    "load_checkpoint": "tinyllm.model.checkpoint",
    "Tokenizer": "tinyllm.model.tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tinyllm.model' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
