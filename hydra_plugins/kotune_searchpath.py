"""Hydra finds this plug-in by its namespace (hydra_plugins/): the presets folders of kotune's loaded
plug-ins (kotune/plugins.py, ``<package>/conf``) join the config search path after kotune's own conf/,
so ``task=my_task`` composes a plug-in's ``conf/task/my_task.yaml``."""
from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class KotunePluginSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from kotune.plugins import conf_dirs

        for folder in conf_dirs()[1:]:
            search_path.append(provider="kotune-plugin", path=f"file://{folder}")
