"""`tinyllm tune`: the engine settings that serve a workload best under its SLO (command.py)."""
