"""Prompt input: OpenAI `messages`, ShareGPT `conversations` or a plain `prompt`, one JSON per line.

Everything is normalized to `{"id", "messages", "source"}` (and the request's `tools`, when
given) where `id` is a hash of the conversation's content, so the same prompt keeps its id
whatever file or line it came from. OpenAI messages keep what agentic and reasoning data carry:
`tool_calls` of assistant turns, `tool` turns (`tool_call_id`, `name`), and the
`reasoning_content` of earlier assistant turns (the chat template decides what it renders).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from eagleflow.logs import InputError

ROLES = ("system", "user", "assistant", "tool")
# Keys of an OpenAI message kept next to role and content (tool use, earlier reasoning).
MESSAGE_EXTRAS = ("reasoning_content", "tool_calls", "tool_call_id", "name")
# ShareGPT speaker names seen in the wild, mapped onto chat roles.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
}


class PromptError(InputError):
    """A prompt line that cannot be used; the message names file and line."""


@dataclass
class NormalizeStats:
    files: list[str]
    lines: int = 0
    kept: int = 0
    duplicates: int = 0
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "lines": self.lines,
            "kept": self.kept,
            "duplicates": self.duplicates,
            "skipped": self.skipped,
            "skipped_examples": self.skipped_examples,
        }


def prompt_id(messages: list[dict], tools: list | None = None) -> str:
    """Content hash of a conversation: stable across files, line order and key order. A plain
    conversation hashes as [[role, content], ...] (ids from before tool use stay the same)."""
    turns = [
        [m["role"], m["content"], *({k: m[k]} for k in MESSAGE_EXTRAS if k in m)] for m in messages
    ]
    canonical = json.dumps(
        [*turns, {"tools": tools}] if tools else turns,
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _message(turn: dict, role: str, text: object, where: str) -> dict:
    """One normalized message: role, content and the OpenAI extras it carries."""
    extras = {k: turn[k] for k in MESSAGE_EXTRAS if turn.get(k) is not None}
    if "tool_calls" in extras and (
        role != "assistant" or not isinstance(extras["tool_calls"], list)
    ):
        raise PromptError(f"{where}: tool_calls must be a list on an assistant turn")
    if "reasoning_content" in extras and role != "assistant":
        raise PromptError(f"{where}: reasoning_content belongs to an assistant turn")
    if text is None and "tool_calls" in extras:
        text = ""  # an assistant turn that only calls tools
    elif not isinstance(text, str) or not text.strip():
        raise PromptError(f"{where}: empty or non-string content")
    return {"role": role, "content": text, **extras}


def _turns(record: dict) -> list[dict]:
    """The conversation of one record as `[{"role", "content"}]`, or PromptError saying why not."""
    if "messages" in record:
        turns, role_key, text_key, names = record["messages"], "role", "content", None
    elif "conversations" in record:
        turns, role_key, text_key, names = record["conversations"], "from", "value", SHAREGPT_ROLES
    elif "prompt" in record:
        turns = [{"role": "user", "content": record["prompt"]}]
        role_key, text_key, names = "role", "content", None
    else:
        raise PromptError("no 'messages', 'conversations' or 'prompt' key")
    if not isinstance(turns, list) or not turns:
        raise PromptError("the conversation is empty or not a list")
    messages = []
    for i, turn in enumerate(turns):
        where = f"turn {i}"
        calls_only = isinstance(turn, dict) and "tool_calls" in turn  # content may be absent
        if (
            not isinstance(turn, dict)
            or role_key not in turn
            or not (text_key in turn or calls_only)
        ):
            raise PromptError(f"{where}: expected an object with '{role_key}' and '{text_key}'")
        speaker, text = turn[role_key], turn.get(text_key)
        role = names.get(speaker) if names else speaker
        if role not in ROLES:
            allowed = sorted(names) if names else list(ROLES)
            raise PromptError(f"{where}: unknown role {speaker!r} (expected one of {allowed})")
        messages.append(_message(turn, role, text, where))
    if not any(m["role"] == "user" for m in messages):
        raise PromptError("no user turn")
    return messages


def parse_line(raw: bytes, source: str) -> dict:
    """One input line as a normalized record; PromptError names `source` (file:line) on failure."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PromptError(f"{source}: not valid UTF-8 (byte {err.start})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise PromptError(f"{source}: malformed JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise PromptError(f"{source}: expected a JSON object, got {type(record).__name__}")
    try:
        messages = _turns(record)
    except PromptError as err:
        raise PromptError(f"{source}: {err}") from None
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise PromptError(f"{source}: tools must be a list (OpenAI function definitions)")
    normalized = {"id": prompt_id(messages, tools), "messages": messages, "source": source}
    if tools:
        normalized["tools"] = tools
    if "id" in record:
        normalized["user_id"] = str(record["id"])
    return normalized


def normalize_prompts(
    paths: list[str | Path], on_error: str = "fail", limit: int | None = None
) -> tuple[list[dict], NormalizeStats]:
    """Read prompt files into normalized records, in file then line order.

    Identical conversations are kept once and counted. `on_error="skip"` counts and reports
    bad lines instead of failing on the first one. Two different conversations that claim the
    same user-supplied `id` are always an error: downstream joins on ids would mix them up.
    """
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', not {on_error!r}")
    stats = NormalizeStats(files=[str(p) for p in paths])
    records: list[dict] = []
    seen: set[str] = set()
    user_ids: dict[str, dict] = {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise PromptError(f"{path}: prompt file does not exist")
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                stats.lines += 1
                source = f"{path}:{number}"
                try:
                    record = parse_line(raw, source)
                    claimed = user_ids.get(record.get("user_id", ""))
                    if claimed and claimed["id"] != record["id"]:
                        raise PromptError(
                            f"{source}: id {record['user_id']!r} already used by a different "
                            f"conversation at {claimed['source']}"
                        )
                except PromptError as err:
                    if on_error == "fail":
                        raise
                    stats.skipped += 1
                    if len(stats.skipped_examples) < 20:
                        stats.skipped_examples.append(str(err))
                    continue
                if "user_id" in record:
                    user_ids[record["user_id"]] = record
                if record["id"] in seen:
                    stats.duplicates += 1
                    continue
                seen.add(record["id"])
                records.append(record)
                if limit is not None and len(records) >= limit:
                    stats.kept = len(records)
                    return records, stats
    if not records:
        files = ", ".join(stats.files)
        raise PromptError(f"no usable prompts in {files} ({stats.lines} non-empty lines read)")
    stats.kept = len(records)
    return records, stats
