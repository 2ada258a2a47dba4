"""Prompt normalization: formats, stable ids, duplicates, and errors that name file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleflow.prompts import PromptError, normalize_prompts, prompt_id


def write_lines(path: Path, lines: list) -> Path:
    path.write_bytes(
        b"".join(
            (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
            for line in lines
        )
    )
    return path


def test_three_formats_normalize_to_one_form_with_stable_ids(tmp_path: Path) -> None:
    openai = {"messages": [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "What is 2 + 2?"}]}  # fmt: skip
    sharegpt = {"conversations": [{"from": "system", "value": "Be brief."},
                                  {"from": "human", "value": "What is 2 + 2?"}]}  # fmt: skip
    plain = {"prompt": "Sort 3, 1, 2."}
    path = write_lines(tmp_path / "p.jsonl", [openai, sharegpt, plain])
    records, stats = normalize_prompts([path])
    # OpenAI and ShareGPT spellings of one conversation are the same prompt.
    assert [r["messages"] for r in records] == [
        openai["messages"],
        [{"role": "user", "content": "Sort 3, 1, 2."}],
    ]
    assert stats.duplicates == 1 and stats.kept == 2 and stats.lines == 3
    assert records[0]["id"] == prompt_id(openai["messages"])
    assert records[0]["source"] == f"{path}:1"
    # The id is a content hash: the same prompt in another file, on another line, keeps it.
    other = write_lines(tmp_path / "q.jsonl", [plain, openai])
    again, _ = normalize_prompts([other])
    assert {r["id"] for r in again} == {r["id"] for r in records}


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        (b'{"messages": [', "malformed JSON"),
        (b'{"prompt": "caf\xe9"}', "not valid UTF-8"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "unknown role 'bot'"),
        ({"conversations": [{"from": "robot", "value": "hi"}]}, "unknown role 'robot'"),
        ({"text": "hi"}, "no 'messages', 'conversations' or 'prompt' key"),
        ({"messages": []}, "empty"),
        ({"messages": [{"role": "user", "content": "  "}]}, "empty or non-string content"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "no user turn"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_line_fails_naming_file_and_line(tmp_path: Path, bad_line, reason: str) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": "fine"}, bad_line])
    with pytest.raises(PromptError) as caught:
        normalize_prompts([path])
    assert str(caught.value).startswith(f"{path}:2: ")
    assert reason in str(caught.value)


def test_skip_policy_counts_and_reports_bad_lines(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        [{"prompt": "one"}, b"not json", {"prompt": "two"}, {"messages": [{"role": "x"}]}],
    )
    records, stats = normalize_prompts([path], on_error="skip")
    assert [r["messages"][0]["content"] for r in records] == ["one", "two"]
    assert stats.skipped == 2
    assert stats.skipped_examples[0].startswith(f"{path}:2: malformed JSON")
    assert stats.skipped_examples[1].startswith(f"{path}:4: ")


def test_conflicting_user_ids_are_an_error(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl", [{"id": "a", "prompt": "one"}, {"id": "a", "prompt": "two"}]
    )
    with pytest.raises(PromptError, match=rf"{path}:2: id 'a' already used .* at {path}:1"):
        normalize_prompts([path])


def test_empty_or_missing_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(PromptError, match=r"no usable prompts in .*empty\.jsonl"):
        normalize_prompts([empty])
    with pytest.raises(PromptError, match=r"missing\.jsonl: prompt file does not exist"):
        normalize_prompts([tmp_path / "missing.jsonl"])


def test_limit_keeps_the_first_prompts(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    records, stats = normalize_prompts([path], limit=3)
    assert [r["messages"][0]["content"] for r in records] == ["p0", "p1", "p2"]
    assert stats.kept == 3
