"""`tinyllm bench`: one seeded workload through every path, with the figures users choose by.

run.py        the command: the paths, run_bench, the parser
workloads.py  the seeded workloads and --random-model checkpoints
anatomy.py    a decode step taken apart, against the matmul floor
report.py     progress, tables and chart
quiet.py      how busy other processes kept the machine during a run
"""

from tinyllm.bench.report import COLUMNS, print_report
from tinyllm.bench.run import add_bench_parser, warm_up
from tinyllm.bench.workloads import default_workload, random_checkpoint

__all__ = ["COLUMNS", "add_bench_parser", "default_workload", "print_report", "random_checkpoint", "warm_up"]
