"""One-line, user-facing errors. The command line (kotune/cli/main.py) prints them without a traceback."""


class KotuneError(Exception):
    """An error the user can fix: bad config, bad data, missing model."""


class DataError(KotuneError):
    """Bad input data; the message names the file, the row and what is wrong."""

    def __init__(self, path: str, where: str | int | None, what: str):
        loc = f"{path}" if where is None else f"{path}:{where}"
        super().__init__(f"{loc}: {what}")
        self.path, self.where, self.what = path, where, what


class ConfigError(KotuneError):
    """A config value that does not fit; the message names the option."""
