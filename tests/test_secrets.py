"""A storage URL's password never reaches a file kotune writes or a line it logs: Hydra's saved
config and overrides, results.json, the exported model card (which export.push_to_hub uploads)."""
from __future__ import annotations

import os
import re
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


# ---- secrets masked by key, whatever they hold ----------------------------------------------------
# each one has distinctive pieces (runs of 4+ letters or digits mixing case, digits or Hangul) that must
# never appear; a plain word (null, None, true, back, comma) a config or a log holds anyway is no evidence
NASTY = [
    "null-Sup3rSecretA",             # starts with null: the old pattern skipped it
    "None_Qz8vWk",                   # starts with None
    "true;Yk4pLmX",                  # starts with true
    "Top Secret#Key&x;y9Bq",         # a space, '#', '&', ';'
    'abc"defQm7Rr',                  # a double quote
    "it's Mv5nBq",                   # a single quote
    "comma,Kp3Zs]brace}Wq8",         # ',', ']', '}'
    "-leadingDashJx6",               # a leading dash
    "pcTg%41%2Fenc7Hq",              # %-escapes
    "비밀번호 한글Ty4",               # Korean
    "at@sign/slash:colonRv2",        # '@', '/', ':' (a URL's password)
    "A@5ecretZ/Pw9Lm",               # a driver splits it at the '@' and names '5ecretZ/Pw9Lm...' the host
    "question?mark#hashNb3",
    "equals=signs&ampXc5",
    "bracket[Op3n]Gh6x",
    "dollar$signPp1",
    "back`tick~tildeWw2",
    "emoji🔑keyEe5",
    "pipe|And4<angle>Aa4z",
    "  spaced Out9  Dd5z ",            # leading and trailing spaces
    "semi;C0lon;Ss3z",
    "-".join(f"Lx{i:02d}q" for i in range(60)),  # a long one
]


def pieces(secret: str) -> set[str]:
    """The secret and its distinctive pieces: any of them in a file or a line is a leak."""
    return {secret.strip()} | {p for p in re.findall(r"[^\W_]{4,}", secret) if not re.fullmatch(r"[a-z]+|[A-Z][a-z]+", p)}


def test_every_nasty_secret_has_distinctive_pieces():
    assert all(len(pieces(s)) >= 2 for s in NASTY)


def leaks(text: str, secrets=NASTY) -> list[str]:
    return sorted({p for s in secrets for p in pieces(s) if p in text})


def hydra_quoted(value: str) -> str:
    return "'" + value.replace("'", "\\'") + "'"


@pytest.mark.parametrize("secret", NASTY)
def test_a_secret_is_masked_by_its_key_whatever_it_holds(secret):
    from kotune.core.redact import mask_override, mask_tree, mask_url, remember_secrets, url_secrets

    # the three forms a setting takes: an override, a parsed config, a storage URL's password
    assert leaks(mask_override(f"serve.api_key={hydra_quoted(secret)}"), [secret]) == []
    assert leaks(mask_override(f"+hub.hf_token={secret}"), [secret]) == []
    tree = {"serve": {"api_key": secret, "host": "127.0.0.1"}, "x": {"password": secret}}
    assert mask_tree(tree) == {"serve": {"api_key": "***", "host": "127.0.0.1"}, "x": {"password": "***"}}
    for url in (f"postgresql+psycopg://kotune:{secret}@db.example:5432/optuna",
                f"postgresql+psycopg://kotune@db.example/optuna?password={secret}"):
        masked = mask_url(url)
        assert leaks(masked, [secret]) == [] and "db.example" in masked, masked
        assert leaks(mask_tree({"hparams_search": {"storage": url}})["hparams_search"]["storage"], [secret]) == []
        # a driver's error text quotes the password, or a piece of it past an '@' as a host: remembered, masked
        remember_secrets(url_secrets(url), url=True)
        for part in re.split(r"[@/:?#]", secret):
            said = f'connection to {url} failed: could not translate host name "{part}" to address'
            assert leaks(mask_credentials(said), [part] if len(part.strip()) >= 5 else []) == []


def test_settings_named_like_tokens_but_no_secret_keep_their_values():
    from kotune.core.redact import mask_override, mask_tree

    config = {"task": {"columns": {"token": 0, "tag": -1}, "head": "token"}, "model": {"tokenizer": {"train": True}},
              "serve": {"api_key": None}, "special": {"mask_token": "[MASK]"}}
    assert mask_tree(config) == config
    assert mask_override("task.columns.token=1") == "task.columns.token=1"
    assert mask_tree({"serve": {"api_key": 12345}, "hub": {"hf_token": "hf_x"}}) == {"serve": {"api_key": "***"},
                                                                                     "hub": {"hf_token": "***"}}


@pytest.mark.parametrize("url, masked", [
    ("postgresql://u@h/db?pwd=sekret", "postgresql://u@h/db?pwd=***"),  # the FIRST query parameter: after '?'
    ("postgresql://u@h/db?token=abc123", "postgresql://u@h/db?token=***"),
    ("postgresql://u@h/db?password=Q6ecret Pw&x=1", "postgresql://u@h/db?password=***&x=1"),
])
def test_a_urls_first_query_parameter_is_masked(url, masked):
    from kotune.core.redact import mask_url

    assert mask_url(url) == masked
    assert mask_credentials(url.replace(" ", "")) == masked.replace(" ", "")


def test_every_file_and_line_of_a_run_hides_every_nasty_secret(tmp_path, cache_dir):
    """One training run carrying every secret, by key: serve.api_key, a `secret` setting each, a storage
    URL whose password holds '@' and '/'; no file in the run directory and no line printed holds any."""
    run = tmp_path / "run"
    storage = f"postgresql+psycopg://kotune:{NASTY[11]}@db.example:5432/optuna?password={NASTY[3]}"
    args = ["task=text_cls", "data=sample", *TINY, "save_model=false", "hparams_search=text_cls",
            f"hparams_search.storage={hydra_quoted(storage)}", f"serve.api_key={hydra_quoted(NASTY[0])}",
            *[f"+s{i}.secret={hydra_quoted(s)}" for i, s in enumerate(NASTY)],
            f"cache_dir={cache_dir}", f"hydra.run.dir={run}"]
    trained = run_cli_here(args)
    assert trained.returncode == 0, trained.stderr[-2000:]
    written = {str(p.relative_to(run)): p.read_text(encoding="utf-8", errors="replace")
               for p in run.rglob("*") if p.is_file()}
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "results.json"} <= set(written)
    assert {name: leaks(text) for name, text in written.items() if leaks(text)} == {}
    assert leaks(trained.stdout + trained.stderr) == []
    # masked by key, the rest of each file as it was: the config still reads back
    from omegaconf import OmegaConf

    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert saved.serve.api_key == "***" and saved.s3.secret == "***" and saved.task.name == "text_cls"
    assert saved.hparams_search.storage == "postgresql+psycopg://kotune:***@db.example:5432/optuna?password=***"
    assert "+s5.secret=***" in OmegaConf.load(run / ".hydra" / "overrides.yaml")


def test_a_storage_that_cannot_be_opened_names_no_piece_of_its_password(tmp_path, cache_dir):
    """The driver parses u:A@5ecret/Pw@host at the first '@' and names '5ecret' its host: its error
    text, printed by the sweep, has the password's pieces masked."""
    storage = "postgresql+psycopg://u:A@5ecretZ/Pw9Lm@127.0.0.1:1/db"
    result = run_cli_here(["-m", "task=text_cls", "data=sample", *TINY, "hparams_search=text_cls",
                           f"hparams_search.storage={hydra_quoted(storage)}", f"cache_dir={cache_dir}",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    said = result.stdout + result.stderr
    assert result.returncode != 0 and "cannot open postgresql+psycopg://u:***@127.0.0.1:1/db" in said, said[-2000:]
    assert leaks(said, ["A@5ecretZ/Pw9Lm"]) == []
    assert [f for f in (tmp_path / "sweep").rglob("*") if f.is_file() and "5ecret" in f.read_text(errors="replace")] == []


def test_hydra_quoting_an_override_it_cannot_parse_shows_no_secret(tmp_path):
    """Hydra's own error line echoes the override it could not parse: the console is masked too."""
    result = run_cli_here(["task=text_cls", "data=sample", "model=tiny", "serve.api_key=abc'defQm7Rr",
                           f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.returncode != 0 and "serve.api_key=***" in result.stderr, result.stderr[-2000:]
    assert leaks(result.stdout + result.stderr, ["abc'defQm7Rr"]) == []


def test_a_search_stores_no_secret_in_its_study():
    """The overrides every trial gets are stored in the study's database (optuna.db in the sweep
    directory, or the shared one): a secret setting among them is stored masked."""
    from kotune.sweeps.study import search_overrides

    stored = search_overrides({"serve.api_key": "Zk7SecretQq", "train.epochs": "3", "+hub.hf_token": "hf_Zk7Qq"}, "none")
    assert stored == {"serve.api_key": "***", "train.epochs": "3", "+hub.hf_token": "***", "hparams_search.pruner": "none"}


def test_a_remembered_secret_piece_leaves_a_model_cards_front_matter_readable():
    """Found where the secrets meet the model card: a storage URL's password "question?mark#…" made
    "question" a secret piece for the rest of the process, and masking the whole card turned
    ``pipeline_tag: question-answering`` into a YAML alias (``***-answering``): the card's tags were
    unreadable and a native QA export lost its task. The body is masked, the front matter is kept."""
    import yaml

    from kotune.core.redact import remember_secrets
    from kotune.export.model_card import masked_card

    remember_secrets(["question?mark#hashNb3"], url=True)
    card = ("---\npipeline_tag: question-answering\ntags:\n- kotune\n- qa\n---\n\n"
            "trained by `python run.py hparams_search.storage=postgresql://u:question?mark#hashNb3@h/db` on question pairs\n")
    front, _, body = masked_card(card).partition("\n---\n\n")
    assert yaml.safe_load(front.removeprefix("---\n")) == {"pipeline_tag": "question-answering", "tags": ["kotune", "qa"]}
    assert "question?mark#hashNb3" not in body and "hashNb3" not in body


# ---- the remembered secrets are a job's -----------------------------------------------------------
# a storage password whose piece before the '@' is a plain word: masked wherever a job that has the
# URL logs it (a driver may name it as a host), and not in a later job of the same process
MEADOW_STORAGE = "postgresql+psycopg://u:meadow@Xq7Zr9kT@db.example:5432/optuna"
WITH_STORAGE = ["hparams_search=text_cls", f"hparams_search.storage='{MEADOW_STORAGE}'"]


def api_job(tmp_path: Path, name: str, *extra: str) -> None:
    """A tiny training through the Python API, its features cached in a folder named "meadow": a job
    that finds them there logs ``features: reused … (<tmp_path>/meadow/features/…)``."""
    from kotune.api import train

    train("task=text_cls", "data=sample", *TINY, "save_model=false", f"cache_dir={tmp_path / 'meadow'}", *extra,
          run_dir=str(tmp_path / name))


def test_within_a_job_its_storage_password_and_its_pieces_stay_masked(tmp_path, capsys):
    api_job(tmp_path, "cache")
    capsys.readouterr()
    api_job(tmp_path, "with-storage", *WITH_STORAGE)
    said = capsys.readouterr().out
    assert f"features: reused 80 cached rows ({tmp_path}{os.sep}***{os.sep}features" in said, said[-2000:]
    assert [s for s in ("meadow", "Xq7Zr9kT") if s in said] == []


def test_a_later_job_in_the_process_does_not_mask_an_earlier_jobs_secrets(tmp_path, capsys):
    """Two jobs through the Python API in one process (a notebook): the first has a storage URL whose
    password holds the word "meadow"; the second's log names the folder "meadow", unmasked."""
    api_job(tmp_path, "with-storage", *WITH_STORAGE)
    capsys.readouterr()
    api_job(tmp_path, "later")
    said = capsys.readouterr().out
    assert f"features: reused 80 cached rows ({tmp_path / 'meadow'}{os.sep}features" in said, said[-2000:]
    assert mask_credentials("u:meadow@Xq7Zr9kT@db") == "u:meadow@Xq7Zr9kT@db"  # nothing of the first job's is known


def test_a_job_inside_a_job_is_the_same_job_and_one_that_raises_keeps_its_secrets():
    from kotune.core.redact import job_secrets, remember_secrets

    with job_secrets():
        remember_secrets(["Wv4EndedSecret"])
        with job_secrets():  # execute() under the command line's main()
            remember_secrets(["Nn5InnerSecret"])
        assert mask_credentials("Wv4EndedSecret Nn5InnerSecret") == "*** ***"
    assert mask_credentials("Wv4EndedSecret Nn5InnerSecret") == "Wv4EndedSecret Nn5InnerSecret"
    with pytest.raises(RuntimeError):  # its traceback, printed after the job, quotes the secret
        with job_secrets():
            remember_secrets(["Zq9RaisedSecret"])
            raise RuntimeError("Zq9RaisedSecret")
    assert mask_credentials("Zq9RaisedSecret") == "***"


def test_a_failed_api_job_raises_the_masked_error_results_json_holds(tmp_path):
    """A job that fails on a path holding a password (a file given as a URL): RunFailed's message, the
    returned results and results.json all say it masked; the job's secrets are forgotten once it
    ends, so the message is masked while the job runs."""
    import json

    from kotune.api import RunFailed, train

    secret_file = "s3://reader:Tz8HiddenPw@bucket/train.tsv"
    with pytest.raises(RunFailed) as failed:
        train("task=text_cls", *TINY, f"data.train_file={secret_file}", f"data.validation_file={secret_file}",
              run_dir=str(tmp_path / "failed"))
    assert "file not found" in str(failed.value) and "Tz8HiddenPw" not in str(failed.value), str(failed.value)
    assert failed.value.results["error"] == str(failed.value)
    assert json.loads((tmp_path / "failed" / "results.json").read_text(encoding="utf-8"))["error"] == str(failed.value)
