"""The one JSONL record file: torn tails skipped and repaired, bad rows named by file:line."""

import json

import pytest

from colbench.jsonl import Appender, cut_torn_tail, read_rows


def _parse(d):
    return int(d["x"])


def test_rows_come_back_through_parse_and_a_torn_tail_is_skipped_then_cut(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"x": 1}\n\n{"x": 2}\n{"x": 3, "y"')  # a kill mid-write: no newline, no closing brace
    with pytest.warns(UserWarning, match=r"rows.jsonl:4: ignoring a truncated last line"):
        assert read_rows(path, _parse) == [1, 2]
    assert path.read_text().endswith('{"x": 3, "y"')  # reading alone changes nothing
    with pytest.warns(UserWarning):
        assert read_rows(path, _parse, repair=True) == [1, 2]
    assert path.read_text() == '{"x": 1}\n\n{"x": 2}\n'


def test_a_bad_row_that_is_not_a_torn_tail_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"x": 1}\n"hello"\n{"x": 3}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not a thing \(a JSON str, not an object\)"):
        read_rows(path, _parse, what="thing")
    path.write_text('{"x": 1}\n{"y": 2}\n')  # complete last line (it ends in a newline): not a torn write
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not a valid record"):
        read_rows(path, _parse)


def test_missing_file_is_empty(tmp_path):
    assert read_rows(tmp_path / "none.jsonl", _parse) == []
    cut_torn_tail(tmp_path / "none.jsonl")  # no error, nothing created
    assert not (tmp_path / "none.jsonl").exists()


def test_appender_starts_on_a_fresh_line_after_a_torn_tail(tmp_path):
    path = tmp_path / "sub" / "rows.jsonl"
    with Appender(path) as out:
        out.write([{"x": 1}, {"x": 2}])
    with path.open("a") as f:
        f.write('{"x": 9')  # torn
    with Appender(path) as out:
        out.write([{"x": 3}, json.dumps({"x": 4})])  # dicts or lines already serialised
        out.write([])
    assert read_rows(path, _parse) == [1, 2, 3, 4]
    assert path.read_text().count("\n") == 4
