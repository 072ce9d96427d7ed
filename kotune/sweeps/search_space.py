"""An Optuna search space from Hydra's override grammar (``choice``, ``range``, ``interval``,
``tag(log, …)``; a plain value fixes a key), checked against the composed config before the first
trial (hydra_plugins/kotune_sweeper.py)."""
from __future__ import annotations

import difflib
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from kotune.cli.overrides import flat_keys


def search_keys(params: DictConfig | dict | None, arguments: list[str]) -> list[str]:
    """Config keys of ``hydra.sweeper.params`` and of the command line's overrides."""
    keys = [str(k) for k in (params or {})]
    parsed = OverridesParser.create().parse_overrides(arguments)
    return keys + [o.key_or_group for o in parsed if not o.is_add() and not o.is_delete()]


def check_search_keys(config: DictConfig, keys: list[str]) -> None:
    """A searched key the config does not have would fail one trial at a time, after the study
    already recorded it: refuse it before the first trial, naming the closest existing key."""
    known = set(flat_keys(OmegaConf.to_container(config, resolve=False))) | set(config.hydra.runtime.choices)
    for key in keys:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigCompositionException(
            f"search space: '{key}' is not a key of the composed config{hint}; fix "
            "hydra.sweeper.params in conf/hparams_search/ or the command line")


def distribution(override: Override) -> Any:
    """One parsed override as an optuna distribution, or its plain value (a fixed key):
    ``choice(a, b)`` → categorical; ``range(a, b, step)`` → int/float with a step (shuffled:
    categorical); ``interval(a, b)`` → uniform, int when both ends are; ``tag(log, …)`` → log scale."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if override.is_range_sweep():
        if any(isinstance(x, float) for x in (value.start, value.stop, value.step)):
            # Hydra's range excludes its stop; optuna's high is inclusive
            return FloatDistribution(value.start, value.stop - value.step, step=value.step)
        return IntDistribution(int(value.start), int(value.stop) - int(value.step), step=int(value.step))
    if override.is_interval_sweep():
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise ConfigCompositionException(f"search space: {override.input_line} is not a sweep Optuna can sample")


def search_space(params: dict[str, str], arguments: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The preset's params then the command line (which wins): searched key → distribution, and
    the fixed keys' values."""
    from optuna.distributions import BaseDistribution

    space: dict[str, Any] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + arguments):
        key = override.get_key_element()
        value = distribution(override)
        space.pop(key, None), fixed.pop(key, None)
        (space if isinstance(value, BaseDistribution) else fixed)[key] = value
    return space, fixed
