"""Shard planning: token-sized shards, deterministic, multi-turn requests."""

from __future__ import annotations

from pathlib import Path

from eagleflow.files import read_jsonl
from eagleflow.plan import generation_requests, pack_shards, write_plan


def conversation(*roles: str) -> list[dict]:
    return [{"role": role, "content": f"{role} {i}"} for i, role in enumerate(roles)]


def test_shards_are_packed_by_tokens_and_capped_by_samples() -> None:
    assert pack_shards([40, 40, 40, 40], shard_tokens=100, max_samples=10) == [
        range(0, 2),
        range(2, 4),
    ]
    assert pack_shards([1] * 5, shard_tokens=100, max_samples=2) == [
        range(0, 2),
        range(2, 4),
        range(4, 5),
    ]
    # A request over the budget still gets a shard of its own.
    assert pack_shards([10, 500, 10], shard_tokens=100, max_samples=10) == [
        range(0, 1),
        range(1, 2),
        range(2, 3),
    ]


def test_last_turn_and_each_turn_requests() -> None:
    prompt = {
        "id": "p",
        "messages": conversation("system", "user", "assistant", "user", "assistant"),
    }
    [last] = generation_requests([prompt], "last")
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "user"]
    each = generation_requests([prompt], "each")
    assert [r["id"] for r in each] == ["p-t0", "p-t1"]
    assert [len(r["messages"]) for r in each] == [2, 4]
    open_ended = {"id": "q", "messages": conversation("user", "assistant", "user")}
    assert [len(r["messages"]) for r in generation_requests([open_ended], "each")] == [1, 3]


def test_same_requests_give_the_same_plan(tmp_path: Path) -> None:
    prompts = [{"id": f"p{i}", "messages": conversation("user")} for i in range(7)]
    requests = generation_requests(prompts, "last")
    ids = [[1] * (5 + i) for i in range(7)]
    settings = {"expected_response_tokens": 10, "shard_tokens": 40, "max_samples": 100}
    first = write_plan(tmp_path / "a", requests, ids, **settings)
    second = write_plan(tmp_path / "b", requests, ids, **settings)
    assert first == second
    assert [s["samples"] for s in first["shards"]] == [2, 2, 2, 1]
    shard = read_jsonl(tmp_path / "a" / "shard-00000.jsonl")
    assert [r["id"] for r in shard] == ["p0", "p1"]
    assert shard[1]["prompt_token_ids"] == [1] * 6
    assert not list(tmp_path.glob(".tmp-*"))
