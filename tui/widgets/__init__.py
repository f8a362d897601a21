"""Widgets of the tinyllm-tui main screen. Each renders from a runner ``Frame``."""
