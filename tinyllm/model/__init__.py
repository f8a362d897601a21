"""The model: the transformer, its config and checkpoints, the tokenizer, training, and solo
generation (the reference every batched path must equal)."""

from tinyllm.lazy import lazy_getattr

# The seed's ``from tinyllm.model import Transformer``, resolved on first use: importing
# ``tinyllm.model.config`` (as the app does, which must not load torch) stays light.
_EXPORTS = {
    "Transformer": "tinyllm.model.transformer",
    "ModelConfig": "tinyllm.model.config",
    "load_checkpoint": "tinyllm.model.checkpoint",
    "Tokenizer": "tinyllm.model.tokenizer",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
