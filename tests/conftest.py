"""pytest configuration and fixtures shared by the test files."""

import os
import sys

# Bytecode is cached for the suite and every process it starts, even where the environment says
# not to (PYTHONDONTWRITEBYTECODE, set on some machines): the suite starts four workers and
# dozens of interpreters that import the same modules, and each compiled tinyllm and tui (and
# pytest rewrote each test module) from source again, ~0.8 s of CPU an interpreter.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Before torch loads its OpenMP runtime (which reads this once): a thread waiting for work sleeps
# instead of spinning. The suite runs more workers than cores, and a command run in-process with
# --threads 2 (whatif, tune) would otherwise spin a second thread against the other workers.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# One intra-op thread per test process, and so for the engine processes the tests start. The
# suite runs as four xdist workers on two cores: with torch's default (a thread per core) each
# worker's OpenMP threads spin waiting for a core another worker holds, and the suite ran 3-4x
# slower than its tests take one at a time. The test models are tiny: a second thread buys nothing.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"
# The cost clock (race, whatif) prices steps with this fixed profile in the tests, instead of
# calibrating this machine's (seconds, once per cache): the same figures on any machine.
# tests/test_cost_clock.py unsets it to test the calibration itself.
os.environ.setdefault("TINYLLM_COST_PROFILE", os.path.join(os.path.dirname(__file__), "data", "cost-profile.json"))


def _wait_for_the_ui_thread_to_idle() -> None:
    """Pilot waits after each key (and in ``pause()``) until the *process* has used under 1 ms of
    CPU in 20 ms, up to 1 s. An app test's engine runs in a thread of the same process, so while
    it ran, every key press waited out that second. The app has taken a key when its UI thread
    (the one running the event loop) is idle: this measures that thread's CPU instead, in finer
    slices. Tests then wait for what they assert (tests/test_app.py ``until``), as before."""
    import asyncio
    import time

    import textual._wait
    import textual.app
    import textual.pilot

    async def wait_for_idle(min_sleep: float = textual._wait.SLEEP_GRANULARITY, max_sleep: float = 1) -> None:
        start = time.monotonic()
        while True:
            cpu = time.thread_time()
            await asyncio.sleep(0.002)
            elapsed = time.monotonic() - start
            if elapsed >= max_sleep or (elapsed > min_sleep and time.thread_time() - cpu < 0.0005):
                return

    textual.app.wait_for_idle = textual.pilot.wait_for_idle = wait_for_idle


_wait_for_the_ui_thread_to_idle()


@pytest.fixture(scope="module")
def client(server):
    """An HTTP client of the test module's own ``server`` fixture (the server tests, the chat tests)."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60.0)) as c:
        yield c


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """And again before every test: a command run in-process (``tinyllm whatif``, default
    --threads 2) sets the process's threads, and the next test on that worker would inherit them
    (the 160x48 main-screen snapshot shows the engine's thread count)."""
    torch.set_num_threads(1)


def pytest_configure(config):
    # Registered here, not in pyproject.toml: it belongs to the app tests' no-error guard (test_app.py).
    config.addinivalue_line(
        "markers",
        "expect_errors(*texts): the test provokes errors; every error the app logs or notifies "
        "must contain one of these texts, and each text must turn up",
    )


# A test's own time (its call, not its fixtures) over this many seconds needs a reason, given as
# @pytest.mark.over_budget("why"): the suite runs on two cores in 4 minutes only if each test
# keeps to what it checks. Reported after the run, not failed: a test's time is the machine's.
BUDGET_S = 15.0


def pytest_terminal_summary(terminalreporter):
    # Which machine the times above are from: CI's log is read where the machine is not known.
    from tinyllm.machine import describe

    terminalreporter.write_sep("-", f"ran on {describe()}")
    over = [
        r
        for outcome in ("passed", "failed")
        for r in terminalreporter.stats.get(outcome, [])
        if r.when == "call" and r.duration > BUDGET_S and "over_budget" not in r.keywords
    ]
    if over:
        terminalreporter.section(f"over the {BUDGET_S:.0f} s budget, with no reason given")
        for r in sorted(over, key=lambda r: -r.duration):
            terminalreporter.line(f"{r.duration:6.1f} s  {r.nodeid}: make it faster, or mark it over_budget('why')")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip where no CUDA device is present, so the suite passes on CPU and
    ``pytest -m cuda`` selects every CUDA test on a GPU (scripts/gpu-check runs them there)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def model():
    """A small seeded random model (tests/helpers.py): for tests where the weights do not matter."""
    from tests.helpers import random_model

    return random_model()


@pytest.fixture(scope="module")
def model_tok():
    """The bundled checkpoint on the CPU: (model, tokenizer), for tests of real text."""
    from tinyllm.model.checkpoint import load_checkpoint

    return load_checkpoint(device="cpu")
