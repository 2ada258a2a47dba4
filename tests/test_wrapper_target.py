"""A target inside a multimodal wrapper (Kimi-K2.5's layout: DeepSeek-V3 decoder settings under
`text_config`, weights under `language_model.*`, a vision tower beside them): the drafter's head
loader and the hf backends find the text decoder. A tiny random-weight replica, saved by
transformers' own Kimi-K2.5 class in the released checkpoint's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, gpus_per_job, run_snakemake, write_config
from replicas import kimi_vocab_size, write_kimi_k25_weights, write_kimi_target
from safetensors import safe_open

from eagleflow.drafter import load_target_head
from eagleflow.extract import extract_shard
from eagleflow.files import read_jsonl
from eagleflow.generate import Sampling, generate_hf
from eagleflow.hf_target import load_causal_lm
from eagleflow.shards import open_shard
from eagleflow.target_config import target_tokenizer


@pytest.fixture(scope="module")
def kimi_k25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_kimi_target(tmp_path_factory.mktemp("targets") / "kimi-k25", layout="k25")
    return write_kimi_k25_weights(path)


def checkpoint_tensor(model: Path, name: str) -> torch.Tensor:
    with safe_open(str(model / "model.safetensors"), "pt") as handle:
        return handle.get_tensor(name)


def test_replica_has_the_released_checkpoints_layout(kimi_k25: Path) -> None:
    with safe_open(str(kimi_k25 / "model.safetensors"), "pt") as handle:
        roots = {".".join(name.split(".")[:2]) for name in handle.keys()}
    assert {"language_model.model", "language_model.lm_head", "vision_tower.encoder"} <= roots


def test_head_loader_finds_the_wrapped_decoders_embedding_norm_and_lm_head(
    kimi_k25: Path,
) -> None:
    head = load_target_head(kimi_k25)
    embed = checkpoint_tensor(kimi_k25, "language_model.model.embed_tokens.weight")
    assert torch.equal(head.embed.weight, embed.float())
    assert torch.equal(head.lm_head, checkpoint_tensor(kimi_k25, "language_model.lm_head.weight"))
    norm = checkpoint_tensor(kimi_k25, "language_model.model.norm.weight")
    assert torch.equal(head.norm.weight, norm.float())
    assert head.embed.weight.shape[0] > kimi_vocab_size(kimi_k25)  # rows beyond the tokenizer


def test_hf_extraction_stores_the_text_decoders_hidden_states(
    kimi_k25: Path, tmp_path: Path
) -> None:
    """Stored layer k equals the decoder's `hidden_states[k]`; the last layer is pre-norm."""
    rng = np.random.default_rng(0)
    samples = [
        {"id": f"s{i}", "input_ids": rng.integers(3, 500, n).tolist(), "loss_mask": [1] * n}
        for i, n in enumerate([5, 17, 9])
    ]
    out = tmp_path / "shard.zarr"
    extract_shard(samples, kimi_k25, out, backend="hf", layer_ids=[2, 4, 5])
    decoder = load_causal_lm(kimi_k25, dtype=torch.float32).get_decoder()
    shard = open_shard(out)
    assert shard.attrs["aux_layer_ids"] == [2, 4, 5] and shard.attrs["last_layer_id"] == 8
    for i, sample in enumerate(samples):
        stored = shard.sample(i)
        with torch.inference_mode():
            ref = decoder(torch.tensor([sample["input_ids"]]), output_hidden_states=True)
            normed = decoder.norm(stored["last"].float())
        pairs = [(stored["aux"][:, j], ref.hidden_states[k][0]) for j, k in enumerate([2, 4, 5])]
        for got, want in [*pairs, (normed, ref.hidden_states[-1][0])]:
            error = (got.float() - want).norm() / want.norm()
            assert error < 0.02, (sample["id"], float(error))


def test_hf_generation_runs_the_wrapped_decoder(kimi_k25: Path) -> None:
    completions = generate_hf(kimi_k25, [[5, 6, 7, 8]], [1], Sampling(0.0, 1.0, 4, 0))
    assert len(completions) == 1 and 1 <= len(completions[0].token_ids) <= 4


def readme_reference_config() -> dict:
    """The config.yaml block of the README's "A drafter for Kimi-K2.5 on one 8-GPU node"."""
    text = (REPO / "README.md").read_text()
    section = text.split("## A drafter for Kimi-K2.5 on one 8-GPU node", 1)[1]
    block = section.split("```yaml\n# config.yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


@pytest.mark.slow
@pytest.mark.usefixtures("gpu_machine")
def test_readme_reference_config_plans_on_the_kimi_replica(kimi_k25: Path, tmp_path: Path) -> None:
    """The README's Kimi-K2.5 config, pointed at the replica: the plan job renders the prompts
    with the shipped tokenizer class and thinking on; the dry run then lists one capture job per
    shard, each (like the serving check) requesting TP = 8 GPUs on an NVIDIA machine (a stand-in
    `nvidia-smi` here), and no demo target, generate or extract job."""
    config = readme_reference_config()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"Question {i}: what is {i} + {i}?"}) + "\n" for i in range(6)
        )
    )
    config["target"]["model"] = str(kimi_k25)
    config["prompts"]["paths"] = [str(prompts)]
    config["plan"] = {"shard_tokens": 150, "max_samples_per_shard": 1000}  # a few shards
    work = tmp_path / "run"
    work.mkdir()
    write_config(work, config)
    run_snakemake(work, "--cores", "1", "results/plan")
    plan = json.loads((work / "results/plan/plan.json").read_text())
    [first] = read_jsonl(work / "results/plan/shard-00000.jsonl")[:1]
    tokenizer = target_tokenizer(kimi_k25, trust_remote_code=True)
    assert tokenizer.decode(first["prompt_token_ids"]).endswith("<|im_middle|><think>")
    gpus = gpus_per_job(run_snakemake(work, "-n", "--resources", "gpu=8").stdout)
    assert gpus["capture"] == [8] * len(plan["shards"]) and len(plan["shards"]) >= 2
    assert gpus["evaluate_serving"] == [8]
    assert not {"demo_target", "generate", "extract"} & gpus.keys()
