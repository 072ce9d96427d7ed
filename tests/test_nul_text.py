"""A NUL character (\\x00) in a data file is refused in one line naming the file, the row and the
column, by every reader (tasks/io.py refuse_nul: the line readers, JSON and JSONL values, including
``\\u0000`` escapes; NER's and DP's line files; a .txt of texts), and by a training run before
anything trains."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT, run_cli_here

NUL = "\x00"


def written(path, text: str):
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name,body,where,column", [
    ("a.tsv", f"text\tlabel\n좋다\t1\n나{NUL}쁘다\t0\n", ":3:", 2),
    ("a.csv", f"text,label\n좋다,1\n\"나쁘{NUL}다\",0\n", ":3:", 4),
    ("a.jsonl", json.dumps({"text": "좋다", "label": "1"}) + "\n" + json.dumps({"text": f"나{NUL}", "label": "0"}) + "\n",
     ":2:", 2),
])
def test_a_delimited_or_jsonl_file_names_the_row_and_column(tmp_path, name, body, where, column):
    from kotune.core.errors import DataError
    from tasks.io import read_records

    path = written(tmp_path / name, body)
    with pytest.raises(DataError) as e:
        read_records(path)
    message = str(e.value)
    assert message.startswith(path + where) and f"NUL character (\\x00) at column {column}" in message
    assert "\n" not in message


def test_a_json_file_names_the_field(tmp_path):
    from kotune.core.errors import DataError
    from tasks.io import read_json, read_records

    rows = [{"text": "좋다", "label": "1"}, {"text": "나", "meta": {"note": f"x{NUL}"}, "label": "0"}]
    path = written(tmp_path / "a.json", json.dumps(rows))
    with pytest.raises(DataError, match=r":row 1: field 'meta.note': a NUL character \(\\x00\) at column 2"):
        read_records(path)
    squad = written(tmp_path / "squad.json", json.dumps({"data": [{"paragraphs": [{"context": f"문{NUL}맥"}]}]}))
    with pytest.raises(DataError, match=r"field 'data\[0\].paragraphs\[0\].context': a NUL character"):
        read_json(squad)


def test_line_files_and_text_files_name_the_line(tmp_path):
    from kotune.core.errors import DataError
    from tasks.embed import read_txt_lines
    from tasks.tagging import read_lines

    conll = written(tmp_path / "ner.conll", f"나\tO\n는\tO\n\n서{NUL}\tB-LC\n")
    with pytest.raises(DataError, match=r"ner.conll:4: a NUL character \(\\x00\) at column 2"):
        read_lines(conll)
    txt = written(tmp_path / "texts.txt", f"첫 줄\n둘째{NUL} 줄\n")
    with pytest.raises(DataError, match=r"texts.txt:2: a NUL character \(\\x00\) at column 3"):
        read_txt_lines(txt)


def test_training_on_a_file_with_a_nul_stops_in_one_line(tmp_path, cache_dir):
    train = tmp_path / "train.tsv"
    shutil.copy(ROOT / "tasks" / "samples" / "text_cls" / "train.tsv", train)
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = lines[3][:2] + NUL + lines[3][2:]
    train.write_text("".join(lines), encoding="utf-8")
    done = run_cli_here(["task=text_cls", "model=tiny", "data=sample", f"data.train_file={train}",
                         "train.max_steps=1", f"cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'run'}"])
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(errors) == 1, done.stderr[-2000:]
    assert errors[0] == (f"error: {train}:4: a NUL character (\\x00) at column 3: not text "
                         "(a binary file, or a broken export?)")
