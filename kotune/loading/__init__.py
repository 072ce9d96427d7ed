"""A job's loading: a fresh model (loading/build.py) or checkpoint= read once (loading/checkpoint.py),
reconciled with the job's config (loading/reconcile.py) and built (loading/from_checkpoint.py),
both ending in loading/built.py's encoded splits."""
