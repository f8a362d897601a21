"""`tinyllm bench`: one seeded workload through every path, with the figures users choose by.

command.py    the command line (its options and the engine's shared ones)
run.py        run_bench: every path on one workload, checked to agree, then the figures
paths.py      the baselines (solo, transformers) and the warm-up
workloads.py  the seeded workloads and --random-model checkpoints
anatomy.py    a decode step taken apart, against the matmul floor
report.py     progress, tables and chart
quiet.py      how busy other processes kept the machine during a run
"""

from tinyllm.bench.paths import warm_up
from tinyllm.bench.report import COLUMNS, print_report
from tinyllm.bench.workloads import default_workload, random_checkpoint

__all__ = ["COLUMNS", "default_workload", "print_report", "random_checkpoint", "warm_up"]
