"""pytest configuration and fixtures shared by the test files."""

import pytest


def pytest_configure(config):
    # Registered here, not in pyproject.toml: it belongs to the app tests' no-error guard (test_app.py).
    config.addinivalue_line(
        "markers", "expect_errors(*texts): the test provokes errors; every error the app logs or notifies "
                   "must contain one of these texts, and each text must turn up")


@pytest.fixture(scope="module")
def model():
    """A small seeded random model (tests/helpers.py): for tests where the weights do not matter."""
    from tests.helpers import random_model
    return random_model()
