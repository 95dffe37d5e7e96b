"""JSONL validation of dataset uploads: formats, and errors that name the line and the field."""

from __future__ import annotations

import pytest
from trainer_service.service import validate_jsonl

from services.common.errors import Unprocessable


def test_accepts_the_three_formats() -> None:
    assert validate_jsonl(b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n') == ("messages", 1)
    assert validate_jsonl(b'{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": "d"}\n') == ("prompt_completion", 2)
    assert validate_jsonl(b'{"prompt": "a", "chosen": "b", "rejected": "c"}') == ("preference", 1)


@pytest.mark.parametrize(("data", "line", "field"), [
    (b"{bad json\n", 1, "(row)"),
    (b'{"prompt": "a", "completion": "b"}\n[1, 2]\n', 2, "(row)"),
    (b'{"messages": []}\n', 1, "messages"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}\n', 1, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": 5}]}\n', 1, "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": "x"}]}\n', 1, "messages[0].role"),
    (b'{"prompt": "a", "completion": ""}\n', 1, "completion"),
    (b'{"prompt": "a", "completion": "b"}\n{"messages": [{"role": "assistant", "content": "x"}]}\n', 2, "(row)"),
    (b'{"text": "a"}\n', 1, "messages"),
])
def test_rejects_bad_rows_naming_line_and_field(data: bytes, line: int, field: str) -> None:
    with pytest.raises(Unprocessable) as exc:
        validate_jsonl(data)
    assert exc.value.extra["line"] == line
    assert exc.value.extra["field"] == field


def test_rejects_empty_and_non_utf8_files() -> None:
    for data in (b"", b"\n\n", b"\xff\xfe"):
        with pytest.raises(Unprocessable) as exc:
            validate_jsonl(data)
        assert exc.value.extra["field"] == "file"


def test_deeply_nested_json_is_a_422_not_a_crash() -> None:
    with pytest.raises(Unprocessable) as exc:
        validate_jsonl(b"[" * 100_000 + b"\n")
    assert exc.value.extra["line"] == 1
