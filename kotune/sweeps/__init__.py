"""Sweeps: multirun job names (naming.py), Hydra's sweep grammar as a search space
(search_space.py), the shared Optuna study (study.py), N workers of one command (workers.py),
trial pruning (pruning.py)."""
