"""kotune's ground floor: what every layer imports and nothing of kotune's is imported by (stdlib only).

errors.py      the one error family (KotuneError: ConfigError, DataError), one line for the user
log.py         ``[kotune] …`` through one ``logging.getLogger("kotune")``, credentials masked
redact.py      secrets masked by key (settings, overrides, a URL's password) and, once met, in any text
files.py       JSON, JSON-lines and CSV (formula cells neutralised) written atomically; a file's SHA-256
atomic_dir.py  a directory written whole (staging, manifest, swap) or not at all
registry.py    the registries a package outside the repository fills: tasks, heads, exporters, runtimes
backends.py    what an export format and a runtime are (Exporter, Runtime: the base classes a plug-in subclasses)
"""
