"""tinyllm-tui: a live monitor and playground for tinyllm's continuous-batching engine."""
