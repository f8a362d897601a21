"""pytest configuration shared by the test files."""


def pytest_configure(config):
    # Registered here, not in pyproject.toml: it belongs to the app tests' no-error guard (test_app.py).
    config.addinivalue_line(
        "markers", "expect_errors(*texts): the test provokes errors; every error the app logs or notifies "
                   "must contain one of these texts, and each text must turn up")
