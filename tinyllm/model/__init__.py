"""The model: the transformer, its config and checkpoints, the tokenizer, training, and solo
generation (the reference every batched path must equal)."""
