"""Training samples keep the engine's ids and mask exactly the assistant tokens."""

from __future__ import annotations

import json
from pathlib import Path

from eagleflow.files import read_jsonl
from eagleflow.prepare import training_sample


def test_sample_is_prompt_then_response_ids_with_assistant_mask() -> None:
    record = {"id": "a", "prompt_token_ids": [1, 2, 3], "response_token_ids": [7, 8, 9]}
    sample = training_sample(record, max_len=100)
    assert sample["input_ids"] == [1, 2, 3, 7, 8, 9]
    assert sample["loss_mask"] == [0, 0, 0, 1, 1, 1]
    assert (sample["num_tokens"], sample["loss_tokens"], sample["cut_at_max_len"]) == (6, 3, False)
    cut = training_sample(record, max_len=4)
    assert (cut["input_ids"], cut["loss_mask"], cut["cut_at_max_len"]) == (
        [1, 2, 3, 7],
        [0, 0, 0, 1],
        True,
    )


def test_demo_samples_equal_engine_ids_and_render_the_conversation(demo_run: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_run / "results/demo/target")
    plan = json.loads((demo_run / "results/plan/plan.json").read_text())
    checked = 0
    for shard in plan["shards"]:
        name = f"shard-{shard['shard']}.jsonl"
        responses = {r["id"]: r for r in read_jsonl(demo_run / "results/responses" / name)}
        for sample in read_jsonl(demo_run / "results/tokens" / name):
            record = responses[sample["id"]]
            engine_ids = record["prompt_token_ids"] + record["response_token_ids"]
            assert sample["input_ids"] == engine_ids[: len(sample["input_ids"])]
            if record["finish_reason"] != "stop" or sample["cut_at_max_len"]:
                continue
            # Decoding the ids gives the chat template's rendering of the whole conversation.
            conversation = [
                *record["messages"],
                {"role": "assistant", "content": record["response_text"]},
            ]
            rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
            decoded = tokenizer.decode(sample["input_ids"], skip_special_tokens=False)
            assert rendered.startswith(decoded) and not rendered[len(decoded) :].strip()
            masked = [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m]
            assert masked == record["response_token_ids"]
            checked += 1
    assert checked >= 250
