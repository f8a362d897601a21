"""`tinyllm bench` (being written)."""


def add_bench_parser(sub) -> None:
    pass
