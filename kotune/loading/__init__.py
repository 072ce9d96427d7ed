"""A job's loading: a fresh model (loading/build.py) or checkpoint= (loading/from_checkpoint.py:
read once by loading/checkpoint.py, reconciled with the job's config by loading/reconcile.py, built
by loading/built.py's ``built_from``), both ending in loading/built.py's encoded splits."""
