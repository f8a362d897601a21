"""The seed's ``tinyllm.kv_cache``: the dense caches, where the seed's code imports them
(``from tinyllm.kv_cache import KVCache, SlotKVCache``). They live in ``tinyllm.kv.dense``."""

from tinyllm.kv.dense import KVCache, SlotKVCache

__all__ = ["KVCache", "SlotKVCache"]
