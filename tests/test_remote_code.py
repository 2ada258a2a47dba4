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


# A template in the style of reasoning and tool-using targets: earlier reasoning, tool calls,
# tool results and the tool list are rendered; a `thinking` variable decides the generation
# prompt; an assistant turn that only calls tools renders; what it does not know, it refuses.
AGENT_TEMPLATE = (
    "{% if tools %}<|im_system|>tools<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_system|>tool:{{ m.tool_call_id }}<|im_middle|>"
    "{{ m.content }}<|im_end|>"
    "{% elif m.role in ('user', 'assistant', 'system') %}"
    "<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}"
    "{% for call in m.tool_calls or [] %}[call {{ call.function.name }}"
    "({{ call.function.arguments }})]{% endfor %}<|im_end|>"
    "{% else %}{{ raise_exception('role ' ~ m.role ~ ' is not supported') }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking is defined and not thinking %}<think></think>{% else %}<think>{% endif %}"
    "{% endif %}"
)
AGENT_CONVERSATION = {
    "messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should call the weather tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}],
}


@pytest.fixture
def agent_target(kimi_k25: Path, tmp_path: Path) -> Path:
    model = shutil.copytree(kimi_k25, tmp_path / "agent")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = AGENT_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def _plan(model: Path, lines: list[dict], tmp_path: Path, **settings) -> tuple[dict, Path]:
    tmp_path.mkdir(exist_ok=True)
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    records, _ = normalize_prompts([raw])
    write_jsonl(tmp_path / "prompts.jsonl", records)
    plan = plan_from_prompts(
        tmp_path / "prompts.jsonl", model, tmp_path / "plan", trust_remote_code=True,
        **{**PLAN, **settings},
    )  # fmt: skip
    return plan, raw


def test_chat_template_kwargs_tool_calls_and_earlier_reasoning_reach_the_render(
    agent_target: Path, tmp_path: Path
) -> None:
    tokenizer = target_tokenizer(agent_target, trust_remote_code=True)
    _plan(agent_target, [AGENT_CONVERSATION], tmp_path / "on")
    [request] = read_jsonl(tmp_path / "on" / "plan" / "shard-00000.jsonl")
    text = tokenizer.decode(request["prompt_token_ids"])
    assert text.startswith('<|im_system|>tools<|im_middle|>[{"type": "function"')
    assert "<think>I should call the weather tool.</think>" in text
    assert '[call weather({"city": "Paris"})]' in text
    assert "<|im_system|>tool:call_1<|im_middle|>18 C, sunny<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    # The template's own variables (Kimi-K2.5's thinking toggle) reach the same render.
    _plan(
        agent_target,
        [AGENT_CONVERSATION],
        tmp_path / "off",
        chat_template_kwargs={"thinking": False},
    )
    [off] = read_jsonl(tmp_path / "off" / "plan" / "shard-00000.jsonl")
    assert tokenizer.decode(off["prompt_token_ids"]).endswith("<|im_middle|><think></think>")
    assert (
        off["prompt_token_ids"][: len(request["prompt_token_ids"]) - 1]
        == request["prompt_token_ids"][:-1]
    )


def test_what_the_template_cannot_render_is_one_error_naming_file_and_line(
    agent_target: Path, tmp_path: Path
) -> None:
    unknown_role = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "x", "content": "late"},
            {"role": "user", "content": "ok"},
        ]
    }
    config = json.loads((agent_target / "tokenizer_config.json").read_text())
    config["chat_template"] = AGENT_TEMPLATE.replace("'tool'", "'function'")
    (agent_target / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as err:
        _plan(agent_target, [{"prompt": "fine"}, unknown_role], tmp_path)
    raw = tmp_path / "raw.jsonl"
    assert str(err.value).startswith(f"{raw}:2: the chat template cannot render prompt ")
    assert str(err.value).endswith("role tool is not supported")
    assert not (tmp_path / "plan").exists()
    plan, _ = _plan(agent_target, [{"prompt": "fine"}, unknown_role], tmp_path, on_error="skip")
    assert plan["samples"] == 1
    [skipped] = plan["skipped"]
    assert skipped["source"] == f"{raw}:2" and skipped["reason"] == "role tool is not supported"
