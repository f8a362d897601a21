"""The race: static batching, continuous batching and the token-budget scheduler on the same
requests and the same model, taking turns step by step in one process.

    views.py  what a viewer sees of a lane (plain frozen data, no torch)
    clock.py  a lane's own clock: it runs only while that lane computes (no torch)
    rules.py  what a workload must satisfy to be raced, checked up front (no torch)
    lanes.py  one scheduler + its clock + its arrivals, stepped one forward pass at a time
    race.py   the lanes, who steps next, the finish line

This package's ``__init__`` imports nothing, so the app (which must not import torch) can import
``tinyllm.race.views``, ``clock`` and ``rules``.
"""
