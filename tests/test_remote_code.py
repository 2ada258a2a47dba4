"""Targets whose tokenizer is code: Kimi-K2 / K2.5's tiktoken class, loaded only when trusted.

Uses the tiny replica of tests/replicas.py (no network, no weights, no vLLM).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from replicas import (
    SPECIAL_TOKEN_OFFSETS,
    kimi_special_token_ids,
    kimi_vocab_size,
    write_kimi_target,
    write_kimi_tokenizer,
)

from eagleflow.chat import render_prompt_ids
from eagleflow.config import missing_paths
from eagleflow.files import read_jsonl, write_jsonl
from eagleflow.fingerprint import target_fingerprint, tokenizer_fingerprint
from eagleflow.generate import Completion, response_records
from eagleflow.logs import InputError
from eagleflow.plan import plan_from_prompts
from eagleflow.prompts import normalize_prompts
from eagleflow.target_config import target_tokenizer, target_vocab_size

PLAN = {
    "turns": "last",
    "max_model_len": 4096,
    "shard_tokens": 200,
    "max_samples_per_shard": 100,
    "expected_response_tokens": 16,
}
GENERATION_PROMPT = "<|im_assistant|>assistant<|im_middle|><think>"
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "Say 你好 to the 世界 in 中文, please."},
]


@pytest.fixture(scope="module", autouse=True)
def no_tiktoken_cache():
    """tiktoken caches every vocabulary it reads under a hash of its *path* (in /tmp), so a
    file rewritten at the same path would be read stale: read the replicas directly."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", "")
        yield


@pytest.fixture(scope="module")
def kimi_k2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Kimi-K2's layout: tokenizer and config both registered through `auto_map`."""
    return write_kimi_target(tmp_path_factory.mktemp("targets") / "kimi-k2", layout="k2")


@pytest.fixture(scope="module")
def kimi_k25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Kimi-K2.5's layout: the tokenizer is code, the wrapper config a type transformers knows."""
    return write_kimi_target(tmp_path_factory.mktemp("targets") / "kimi-k25", layout="k25")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Normalized prompts (as eagleflow.prompts writes them) in each input format."""
    root = tmp_path_factory.mktemp("prompts")
    raw = [
        {"prompt": "Tell me a story about a cat who lived in a library."},
        {"messages": CONVERSATION},
        {"conversations": [{"from": "human", "value": "你好，世界。What is 3.14 + 42?"}]},
    ]
    (root / "raw.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in raw))
    records, _ = normalize_prompts([root / "raw.jsonl"])
    write_jsonl(root / "prompts.jsonl", records)
    return root / "prompts.jsonl"


@pytest.mark.parametrize("layout", ["k2", "k25"])
def test_untrusted_kimi_is_one_clear_error(
    layout: str, prompts: Path, tmp_path: Path, request: pytest.FixtureRequest
):
    """Kimi-K2 (a model type transformers does not know) and Kimi-K2.5 (one it knows: untrusted,
    transformers would quietly build another tokenizer from tiktoken.model, with other ids for
    text such as ' 中文') are refused alike, by the config check and by the plan."""
    model = request.getfixturevalue("kimi_k2" if layout == "k2" else "kimi_k25")
    expected = (
        f"target.model: {model} ships its tokenizer as code (tokenization_kimi.TikTokenTokenizer, "
        "auto_map in tokenizer_config.json); set target.trust_remote_code: true to run it"
    )
    config = {"target": {"model": str(model), "trust_remote_code": False}, "prompts": {"paths": []}}
    assert missing_paths(config) == [expected]
    config["target"]["trust_remote_code"] = True
    assert missing_paths(config) == []
    with pytest.raises(InputError) as err:
        plan_from_prompts(prompts, model, tmp_path / "plan", trust_remote_code=False, **PLAN)
    assert str(err.value) == expected
    assert not (tmp_path / "plan").exists()


def test_tokenizer_code_that_fails_to_import_is_one_clear_error(
    kimi_k2: Path, prompts: Path, tmp_path: Path
):
    """Tokenizer code written for transformers 4 (older Kimi-K2 revisions import
    bytes_to_unicode from transformers.models.gpt2.tokenization_gpt2, gone in transformers 5)."""
    model = shutil.copytree(kimi_k2, tmp_path / "kimi-k2-old")
    code = model / "tokenization_kimi.py"
    new_import = "from transformers.convert_slow_tokenizer import bytes_to_unicode"
    old_import = "from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode"
    code.write_text(code.read_text().replace(new_import, old_import))
    with pytest.raises(InputError, match=r"^target\.model: .*bytes_to_unicode"):
        plan_from_prompts(prompts, model, tmp_path / "plan", trust_remote_code=True, **PLAN)
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("layout", ["k2", "k25"])
def test_trusted_kimi_tokenizer_round_trips(layout: str, request: pytest.FixtureRequest):
    model = request.getfixturevalue("kimi_k2" if layout == "k2" else "kimi_k25")
    tokenizer = target_tokenizer(model, trust_remote_code=True)
    assert type(tokenizer).__name__ == "TikTokenTokenizer"
    assert len(tokenizer) == tokenizer.vocab_size == kimi_vocab_size(model)
    assert target_vocab_size(model) > len(tokenizer)  # embedding rows beyond the tokenizer

    text = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(
        CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert text.startswith("<|im_system|>system<|im_middle|>You are a helpful assistant.")
    assert "<|im_assistant|>assistant<|im_middle|><think></think>The capital" in text
    assert text.endswith(GENERATION_PROMPT)
    assert ids == render_prompt_ids(tokenizer, CONVERSATION)  # the workflow's rendering
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=False) == text

    special = kimi_special_token_ids(model)
    assert ids.count(special["<|im_end|>"]) == len(CONVERSATION)
    ending = tokenizer.encode(GENERATION_PROMPT)
    assert ids[-len(ending) :] == ending
    assert ending[0] == special["<|im_assistant|>"]
    assert ending[-2:] == [special["<|im_middle|>"], special["<think>"]]
    for token in SPECIAL_TOKEN_OFFSETS:
        assert tokenizer.encode(token, add_special_tokens=False) == [special[token]], token
        assert tokenizer.convert_tokens_to_ids(token) == special[token]
        assert tokenizer.decode([special[token]]) == token
    plain = tokenizer.decode(ids, skip_special_tokens=True)
    assert "<|im_end|>" not in plain and "<think>" in plain and "世界" in plain

    no_thinking = tokenizer.apply_chat_template(
        CONVERSATION[1:2], add_generation_prompt=True, tokenize=False, thinking=False
    )
    assert no_thinking.startswith("<|im_system|>system<|im_middle|>You are Kimi")
    assert no_thinking.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")


def test_trusted_kimi_target_is_planned(kimi_k2: Path, prompts: Path, tmp_path: Path):
    summary = plan_from_prompts(prompts, kimi_k2, tmp_path / "plan", trust_remote_code=True, **PLAN)
    assert (
        summary["samples"] == 3
        and summary["estimated_tokens"] > 3 * PLAN["expected_response_tokens"]
    )
    assert len(summary["shards"]) >= 2  # 200-token shards
    tokenizer = target_tokenizer(kimi_k2, trust_remote_code=True)
    ending = tokenizer.encode(GENERATION_PROMPT)
    shards = [tmp_path / "plan" / f"shard-{s['shard']}.jsonl" for s in summary["shards"]]
    planned = [record for shard in shards for record in read_jsonl(shard)]
    assert len(planned) == 3
    for record in planned:
        ids = record["prompt_token_ids"]
        assert len(ids) > len(ending) and ids[-len(ending) :] == ending
        assert ids == render_prompt_ids(tokenizer, record["messages"])
        assert max(ids) < len(tokenizer)


def test_answers_decode_with_the_kimi_tokenizer(kimi_k2: Path):
    tokenizer = target_tokenizer(kimi_k2, trust_remote_code=True)
    end = kimi_special_token_ids(kimi_k2)["<|im_end|>"]
    answer = tokenizer.encode("<think>Easy.</think>The capital of France is Paris. 你好！")
    request = {"id": "r", "prompt_id": "p", "messages": [], "prompt_token_ids": [1, 2]}
    [record], truncated = response_records(
        [request], [Completion([*answer, end], "stop")], tokenizer, "keep"
    )
    assert truncated == 0
    assert record["response_text"] == "<think>Easy.</think>The capital of France is Paris. 你好！"
    assert record["response_token_ids"][-1] == end


def test_config_check_accepts_a_tiktoken_directory(kimi_k2: Path, tmp_path: Path):
    target = {"model": str(kimi_k2), "trust_remote_code": True}
    assert missing_paths({"target": target, "prompts": {"paths": []}}) == []
    bare = shutil.copytree(kimi_k2, tmp_path / "bare")
    (bare / "tiktoken.model").unlink()
    target["model"] = str(bare)
    [problem] = missing_paths({"target": target, "prompts": {"paths": []}})
    assert problem.startswith(f"target.model: {bare} has no tokenizer (")


def test_tokenizer_fingerprint_covers_the_tokenizer_code(tmp_path: Path):
    first = write_kimi_tokenizer(tmp_path / "a")
    second = write_kimi_tokenizer(tmp_path / "b")
    fingerprint = tokenizer_fingerprint(first)
    assert fingerprint is not None
    assert tokenizer_fingerprint(second) == fingerprint  # the replica is deterministic
    code = second / "tokenization_kimi.py"
    code.write_text(code.read_text() + "# a fix in the shipped tokenizer class\n")
    assert tokenizer_fingerprint(second) != fingerprint


def test_target_fingerprint_covers_the_model_code_it_ships(kimi_k2: Path, tmp_path: Path):
    model = shutil.copytree(kimi_k2, tmp_path / "kimi-k2")
    [code] = model.glob("configuration_*.py")
    before = target_fingerprint(model)
    code.write_text(code.read_text() + "# a fix in the shipped config class\n")
    assert target_fingerprint(model) != before
