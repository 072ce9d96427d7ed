"""A storage URL's password never reaches a file kotune writes or a line it logs: Hydra's saved
config and overrides, results.json, the exported model card (which export.push_to_hub uploads)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli_here
from kotune.core.redact import mask_credentials

# a password holding '@' and '/', and a second one given as a query parameter (libpq's form)
STORAGE = "postgresql+psycopg://kotune:Pa@ss/W0rd@db.example:5432/optuna?sslmode=require&password=QuerySecret"
API_KEY = "K3yS3cret-serve"
SECRETS = ("Pa@ss", "W0rd", "QuerySecret", API_KEY)
TINY = ["model=tiny", "train.max_steps=2", "train.batch_size=8", "save_predictions=false"]


@pytest.mark.parametrize("url, masked", [
    ("postgresql://user:secret@host/db", "postgresql://user:***@host/db"),
    ("postgresql://:secret@host/db", "postgresql://:***@host/db"),
    ("postgresql://u:p@ss@host:5432/db", "postgresql://u:***@host:5432/db"),
    ("postgresql://u:a/b@host/db", "postgresql://u:***@host/db"),
    ("postgresql+psycopg://u@host/db?password=sekret&sslmode=x", "postgresql+psycopg://u@host/db?password=***&sslmode=x"),
    ("mysql://u:pw@h/d?sslmode=x&PASSWORD=y", "mysql://u:***@h/d?sslmode=x&PASSWORD=***"),
    ("sqlite:///sweep/optuna.db", "sqlite:///sweep/optuna.db"),
    ("https://huggingface.co/klue/bert-base", "https://huggingface.co/klue/bert-base"),
    ("https://example.com/@user/page", "https://example.com/@user/page"),
    ("serve.api_key=abc-123", "serve.api_key=***"),
    ("api_key: abc-123", "api_key: ***"),
    ("api_key: null", "api_key: null"),
    ("mask_token: '[MASK]'", "mask_token: '[MASK]'"),
])
def test_every_credential_form_is_masked(url, masked):
    assert mask_credentials(url) == masked
    assert mask_credentials(f"storage: '{url}', next") == f"storage: '{masked}', next"


def files_holding(folder: Path, secrets: tuple[str, ...]) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(folder)}: {s}" for s in secrets if s.encode() in data]
    return found


def test_a_single_run_and_its_export_never_write_or_log_the_password(tmp_path, cache_dir):
    run = tmp_path / "run"
    trained = run_cli_here(["task=text_cls", "data=sample", *TINY, "hparams_search=text_cls",
                            f"hparams_search.storage='{STORAGE}'", f"serve.api_key={API_KEY}", f"cache_dir={cache_dir}",
                            f"hydra.run.dir={run}"])
    assert trained.returncode == 0, trained.stderr[-2000:]
    exported = run_cli_here(["action=export", f"checkpoint={run}", f"export.dir={tmp_path / 'hf'}",
                             f"cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'export-run'}"])
    assert exported.returncode == 0, exported.stderr[-2000:]
    # the files the issue found it in are there, masked
    assert (run / ".hydra" / "overrides.yaml").read_text(encoding="utf-8").count("kotune:***@db.example") == 1
    assert "kotune:***@db.example" in (run / "results.json").read_text(encoding="utf-8")
    assert (tmp_path / "hf" / "README.md").exists()
    assert files_holding(tmp_path, SECRETS) == []
    logged = trained.stdout + trained.stderr + exported.stdout + exported.stderr
    assert [s for s in SECRETS if s in logged] == []


def test_log_records_of_any_logger_are_masked(caplog):
    import logging

    import kotune.core.log  # noqa: F401 - installs the masking record factory

    with caplog.at_level(logging.INFO):
        logging.getLogger("hydra.launcher").info("#0 : hparams_search.storage=%s", STORAGE)
    assert caplog.records and not [s for s in SECRETS if s in caplog.text]
    assert "kotune:***@db.example" in caplog.text
