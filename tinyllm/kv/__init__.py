"""KV caches: dense slots, the paged block pool (with prefix caching), the ragged attention
back-end, and CUDA graphs. All implement the model's begin / attend / end."""
