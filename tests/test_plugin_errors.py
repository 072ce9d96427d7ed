"""A plug-in that fails to import (kotune/plugins.py): named by ``plugins=``, whatever it raises is one
line naming it and its error; installed as an entry point, it is one warning and the jobs that do
not need it go on, while a job that needs it (its ``task=``, a checkpoint of its task) stops with
that error in one line. The entry points are faked in this process (``entry_point_modules``)."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli_here

FAILURES = {
    "RuntimeError": ("raise RuntimeError('the plug-in is broken')\n", "RuntimeError: the plug-in is broken"),
    "SyntaxError": ("def f(:\n    pass\n", "SyntaxError: "),
    "ValueError": ("raise ValueError('bad value at import')\n", "ValueError: bad value at import"),
}


def write_package(root, name: str, body: str, preset: str | None = None) -> None:
    """A package ``name`` under ``root`` whose import runs ``body``, with conf/task/<preset>.yaml."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(body, encoding="utf-8")
    if preset:
        (root / name / "conf" / "task").mkdir(parents=True)
        (root / name / "conf" / "task" / f"{preset}.yaml").write_text(f"name: {preset}\nkind: {preset}\n")


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """The installed entry point ``broken_ep_plugin`` (task ``broken_task``) raising ValueError."""
    import kotune.plugins as plugins

    write_package(tmp_path / "site", "broken_ep_plugin", FAILURES["ValueError"][0], preset="broken_task")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(plugins, "entry_point_modules", lambda: ["broken_ep_plugin"])
    monkeypatch.setattr(plugins, "_broken", {}, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_error(done) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_named_plugin_that_raises_is_one_line_naming_it_and_its_error(failure, tmp_path, monkeypatch):
    from kotune.api.compose import compose_job
    from kotune.core.errors import ConfigError

    module = f"bad_plugin_{failure.lower()}"
    write_package(tmp_path, module, FAILURES[failure][0])
    monkeypatch.syspath_prepend(str(tmp_path))
    line = one_error(run_cli_here(["task=text_cls", "model=tiny", f"plugins=[{module}]"]))
    assert f"'{module}'" in line and FAILURES[failure][1] in line
    if failure == "SyntaxError":
        assert "__init__.py, line 1" in line
    with pytest.raises(ConfigError) as e:
        compose_job(["task=text_cls", "model=tiny", f"plugins=[{module}]"])
    assert f"'{module}'" in str(e.value) and FAILURES[failure][1] in str(e.value) and "\n" not in str(e.value)


def test_a_broken_installed_plugin_warns_once_and_jobs_that_do_not_use_it_go_on(broken, capsys):
    from kotune.api.compose import compose_job

    cfg = compose_job(["task=text_cls", "model=tiny"])
    again = compose_job(["task=nli", "model=tiny"])
    assert cfg.task.name == "text_cls" and again.task.name == "nli"
    warned = [line for line in capsys.readouterr().out.splitlines() if "broken_ep_plugin" in line]
    assert len(warned) == 1, warned
    assert "ValueError: bad value at import" in warned[0] and "warning" in warned[0]


def test_a_job_that_needs_the_broken_installed_plugin_stops_with_its_error(broken):
    line = one_error(run_cli_here(["task=broken_task", "model=tiny"]))
    assert "task=broken_task" in line and "'broken_ep_plugin'" in line and "ValueError: bad value at import" in line
    line = one_error(run_cli_here(["task=text_cls", "model=tiny", "plugins=[broken_ep_plugin]"]))
    assert "'broken_ep_plugin'" in line and "ValueError: bad value at import" in line


def test_a_checkpoint_of_the_broken_plugins_task_is_refused_with_its_error(broken):
    from kotune.api.compose import compose_job
    from kotune.core.errors import KotuneError

    model = broken / "run" / "model"
    model.mkdir(parents=True)
    (model / "kotune.json").write_text(json.dumps({"head": "sequence", "meta": {
        "task": "broken_task", "plugin": "broken_ep_plugin.tasks"}}))
    line = one_error(run_cli_here(["action=predict", f"checkpoint={broken / 'run'}"]))
    assert "comes from the plug-in 'broken_ep_plugin.tasks'" in line and "ValueError: bad value at import" in line
    with pytest.raises(KotuneError, match="ValueError: bad value at import"):
        compose_job(["action=predict", f"checkpoint={broken / 'run'}"])
