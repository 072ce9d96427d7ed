"""kotune's example plug-in, and the test that a package outside the repository can add a task kind, a
head and an export format without a line of kotune changed (tests/test_plugins.py; the worked example
of docs/development/plugins.md). kotune imports it when a job names it (``plugins=[kotune_example_plugin]``)
or when it is installed with its entry point (pyproject.toml here)."""
from kotune_example_plugin import exporters, heads, tasks  # noqa: F401  (each module registers what it defines)
