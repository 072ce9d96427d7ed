"""kotune's command-line machinery, one module per concern (imports point down only):

cli → job → actions/<one file per action> → trainer / predict → resume, build → runtime, config

Importing the package registers the config resolvers (``kotune.config``) that conf/ uses.
"""
from kotune import config  # noqa: F401  (registers ${kotune_lr:…} and ${kotune_mix_lr:…})
