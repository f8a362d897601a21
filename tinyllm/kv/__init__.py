"""KV caches: dense slots, the paged block pool (its bookkeeping in ``blocks``, with prefix
caching; its tensors in ``paged``), the ragged attention back-end, and CUDA graphs. All caches
implement the model's begin / attend / end."""
