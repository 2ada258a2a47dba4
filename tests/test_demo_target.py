"""The demo target: a correct, held-out corpus, a deterministic, well-formed build, and the
shipped build of the default settings.

Builds here are tiny (a few steps on a few hundred conversations); the full-quality build (the
shipped one) is checked with vLLM elsewhere.
"""

import hashlib
import os
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagleflow.demo import corpus, number_tasks, shipped, word_tasks
from eagleflow.demo.target import build_demo_target
from eagleflow.logs import InputError

TINY_BUILD = {
    "train_steps": 2,
    "num_conversations": 200,
    "tokenizer_vocab_size": 400,
    "batch_size": 4,
}
SAMPLES_PER_FAMILY = 200


def _numbers(text: str) -> list[int]:
    return [int(number) for number in re.findall(r"\d+", text)]


def _letter(text: str) -> str:
    return re.findall(r"\b([a-z])\b", text)[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_shipped_files_match(directory: Path, manifest: dict) -> None:
    """The directory holds exactly the manifest's files (and the manifest), with its sha256s."""
    assert {name: _sha256(directory / name) for name in manifest["files"]} == manifest["files"]
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted([*manifest["files"], "manifest.json"])


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("tiny") / "target"
    build_demo_target(out_dir, **TINY_BUILD)
    return out_dir


def test_arithmetic_answers_are_correct() -> None:
    rng = random.Random(1)
    for _ in range(SAMPLES_PER_FAMILY):
        a, b = _numbers((problem := number_tasks.addition(rng)).user)
        assert int(problem.answer) == a + b
        a, b = _numbers((problem := number_tasks.subtraction(rng)).user)
        assert int(problem.answer) == abs(a - b)
        a, b = _numbers((problem := number_tasks.multiplication(rng)).user)
        assert int(problem.answer) == a * b
        assert problem.answer in problem.answer_sentence


def test_sorting_answers_are_correct() -> None:
    rng = random.Random(2)
    for _ in range(SAMPLES_PER_FAMILY):
        problem = number_tasks.sort_numbers(rng)
        descending = re.search(r"largest to|descending|biggest to", problem.user) is not None
        expected = sorted(_numbers(problem.user), reverse=descending)
        assert problem.answer == ", ".join(map(str, expected))
        problem = word_tasks.sort_words(rng)
        words = [w for w in re.findall(r"[a-z]+", problem.user) if w in word_tasks.WORDS]
        assert problem.answer == ", ".join(sorted(words))


def test_unit_conversions_are_correct() -> None:
    rng = random.Random(3)
    for _ in range(SAMPLES_PER_FAMILY):
        problem = number_tasks.unit_conversion(rng)
        (factor,) = [
            factor
            for _, units, target, factor in number_tasks.CONVERSIONS
            if re.search(rf"\b{units}\b", problem.user)
            and re.search(rf"\b{target}\b", problem.user)
        ]
        (quantity,) = _numbers(problem.user)
        assert int(problem.answer) == quantity * factor


def test_string_edits_are_correct() -> None:
    rng = random.Random(4)
    for _ in range(SAMPLES_PER_FAMILY):
        word = rng.choice(word_tasks.WORDS)
        assert word_tasks.reverse_word(rng, word).answer == word[::-1]
        assert word_tasks.uppercase_word(rng, word).answer == word.upper()
        assert word_tasks.word_length(rng, word).answer == str(len(word))
        problem = word_tasks.count_letter(rng, word)
        assert problem.answer == str(word.count(_letter(problem.user)))
        problem = word_tasks.remove_letter(rng, word)
        assert problem.answer == word.replace(_letter(problem.user), "")
        assert re.search(rf"\b{word}\b", problem.user)


def test_conversations_have_the_chat_shape() -> None:
    for conversation in corpus.training_conversations(seed=0, n=100):
        roles = [message["role"] for message in conversation]
        assert roles in (["user", "assistant"], ["system", "user", "assistant"])
        assert re.fullmatch(r"<think>\n.+\n</think>\n\n.+", conversation[-1]["content"], re.DOTALL)


def test_demo_prompts_are_held_out_distinct_and_deterministic() -> None:
    training_users = {
        conversation[-2]["content"]
        for conversation in corpus.training_conversations(seed=0, n=5000)
    }
    prompts = corpus.demo_prompts(seed=0, n=2000)
    users = [record["messages"][-1]["content"] for record in prompts]
    assert len(set(users)) == 2000
    assert not training_users & set(users)
    assert all(record["messages"][-1]["role"] == "user" for record in prompts)
    assert prompts[:50] == corpus.demo_prompts(seed=0, n=50)
    first_user = users[0]
    assert first_user not in {
        record["messages"][-1]["content"]
        for record in corpus.demo_prompts(0, 50, exclude={first_user})
    }


def test_build_is_bit_identical(tmp_path: Path, tiny_target: Path) -> None:
    rebuilt = tmp_path / "again"
    build_demo_target(rebuilt, **TINY_BUILD)
    for name in ("model.safetensors", "tokenizer.json"):
        assert _sha256(rebuilt / name) == _sha256(tiny_target / name)


def test_build_replaces_output_atomically(tmp_path: Path) -> None:
    out_dir = tmp_path / "target"
    out_dir.mkdir()
    (out_dir / "stale.txt").write_text("from an older build")
    build_demo_target(out_dir, **TINY_BUILD)
    assert not (out_dir / "stale.txt").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["target"]


def test_built_model_loads_with_expected_invariants(tiny_target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    model = AutoModelForCausalLM.from_pretrained(tiny_target)
    config = model.config
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.num_hidden_layers >= 8
    assert len({2, config.num_hidden_layers // 2, config.num_hidden_layers - 3}) == 3
    assert config.vocab_size % 64 == 0 and config.vocab_size >= len(tokenizer)
    assert model.get_input_embeddings().weight.shape[0] == config.vocab_size
    assert model.get_output_embeddings().weight.shape[0] == config.vocab_size
    assert not config.tie_word_embeddings
    assert config.num_key_value_heads < config.num_attention_heads
    assert model.dtype == torch.bfloat16
    assert (
        config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    )
    assert GenerationConfig.from_pretrained(tiny_target).eos_token_id == config.eos_token_id

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|>\n")
    think_ids = tokenizer.encode("<think>\nx\n</think>", add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("<think>") in think_ids
    assert tokenizer.decode(think_ids, skip_special_tokens=True) == "<think>\nx\n</think>"

    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > inputs["input_ids"].shape[1]


def test_shipped_target_is_what_its_manifest_and_the_build_code_say() -> None:
    """Its files are the manifest's, built by this code with this torch: after a change to
    the build, `python -m eagleflow.demo.shipped --refresh` ships the new build."""
    manifest = shipped.shipped_manifest()
    _assert_shipped_files_match(shipped.SHIPPED_DIR, manifest)
    refresh = "the demo build changed: run `python -m eagleflow.demo.shipped --refresh`"
    assert shipped.build_code_sha256() == manifest["build_code_sha256"], refresh
    assert torch.__version__.split("+")[0] == manifest["torch"].split("+")[0], refresh
    # The demo's settings: `snakemake --cores all` copies it.
    config = yaml.safe_load((Path(__file__).parents[1] / "config.yaml").read_text())
    assert manifest["settings"] == config["demo_target"]


def test_default_settings_copy_the_shipped_target_and_others_are_built(tmp_path: Path) -> None:
    out_dir = tmp_path / "target"
    out_dir.mkdir()
    (out_dir / "stale.txt").write_text("from an older build")
    summary = shipped.provide_demo_target(out_dir, **shipped.shipped_manifest()["settings"])
    assert summary["source"].startswith("shipped")
    assert {p.name: _sha256(p) for p in out_dir.iterdir()} == shipped.shipped_manifest()["files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]
    built = shipped.provide_demo_target(tmp_path / "tiny", **TINY_BUILD)
    assert built["source"] == "built here" and built["steps"] == TINY_BUILD["train_steps"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [("change", "sha256 differs"), ("delete", "listed in manifest.json but missing")],
)
def test_damaged_shipped_file_is_named_and_leaves_no_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str, message: str
) -> None:
    copy = tmp_path / "shipped_target"
    shutil.copytree(shipped.SHIPPED_DIR, copy)
    tokenizer = copy / "tokenizer.json"
    if damage == "change":
        tokenizer.write_text(tokenizer.read_text().replace("<think>", "<thonk>"))
    else:
        tokenizer.unlink()
    monkeypatch.setattr(shipped, "SHIPPED_DIR", copy)
    monkeypatch.setattr(shipped, "MANIFEST", copy / "manifest.json")
    out_dir = tmp_path / "run" / "target"
    with pytest.raises(InputError, match=rf"shipped_target/tokenizer\.json: {message}"):
        shipped.provide_demo_target(out_dir, **shipped.shipped_manifest()["settings"])
    assert list((tmp_path / "run").iterdir()) == []  # no target, no staging left


def test_refresh_ships_a_build_that_check_confirms_and_the_job_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--refresh` then `--check` end to end, on tiny settings in a stand-in shipped directory."""
    stand_in = tmp_path / "shipped_target"
    stand_in.mkdir()
    (stand_in / "stale.bin").write_bytes(b"an older shipped build")
    monkeypatch.setattr(shipped, "SHIPPED_DIR", stand_in)
    monkeypatch.setattr(shipped, "MANIFEST", stand_in / "manifest.json")
    manifest = shipped.refresh(TINY_BUILD)
    assert shipped.shipped_manifest() == manifest
    assert manifest["settings"] == TINY_BUILD
    assert manifest["build_code_sha256"] == shipped.build_code_sha256()
    _assert_shipped_files_match(stand_in, manifest)  # the stale file is gone
    assert shipped.check_rebuild() == []  # a rebuild here has the same bits
    summary = shipped.provide_demo_target(tmp_path / "run" / "target", **TINY_BUILD)
    assert summary["source"].startswith("shipped")
