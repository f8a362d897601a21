"""Measure the bundled model's reference cost profile (tinyllm/data/cost/shakespeare-cpu.json).

Run it on a quiet machine, nothing else running, and commit the file it writes: every machine
without a profile of its own prices the race, ``tinyllm whatif`` and ``tinyllm tune`` with it.
It calibrates as ``--cost-profile measure`` does (the fastest of repeated passes), at one torch
thread (the app's race and tune run one), and names the machine in the profile's source.

    .venv/bin/python scripts/reference_profile.py [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from tinyllm.machine import cpu_name
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.race.calibrate import REFERENCE, calibrate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", default=str(REFERENCE), help="where to write it (default: the shipped file)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, _ = load_checkpoint(device="cpu")
    fitted, (median, p95), n, how_far = calibrate(model, say=print)
    source = (
        f"reference: the bundled model measured on a quiet {torch.get_num_threads()}-thread run on "
        f"{cpu_name()} ({torch.__version__}), {n} passes ({how_far}): median error {median:.0%}, p95 {p95:.0%}"
    )
    profile = dataclasses.replace(fitted, source=source)
    with open(args.out, "w") as f:
        f.write(profile.to_json() + "\n")
    print(f"wrote {args.out}: {source}")


if __name__ == "__main__":
    main()
