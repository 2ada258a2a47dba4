"""A target inside a multimodal wrapper (Kimi-K2.5's layout: DeepSeek-V3 decoder settings under
`text_config`, weights under `language_model.*`, a vision tower beside them): the drafter's head
loader and the hf backends find the text decoder. A tiny random-weight replica, saved by
transformers' own Kimi-K2.5 class in the released checkpoint's layout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, free_port, gpus_per_job, run_snakemake, write_config
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
            assert error < 0.03, (sample["id"], float(error))  # bf16 compute vs fp32


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

    # The SLURM variant: the servers.yaml that scripts/slurm/extraction_servers.sbatch writes,
    # merged over the config. The capture jobs then hold no GPU (the servers do).
    urls = "[http://node1:8001, http://node2:8001]"
    (work / "servers.yaml").write_text(
        f"generation: {{backend: server, server_url: {urls}}}\n"
        f"extract: {{backend: server, server_url: {urls}}}\n"
    )
    merged = run_snakemake(
        work, "-n", "--resources", "gpu=8", "--configfile", "config.yaml", "servers.yaml"
    )
    gpus = gpus_per_job(merged.stdout)
    assert len(gpus["capture"]) == len(plan["shards"]) and not any(gpus["capture"])
    assert gpus["evaluate_serving"] == [8]


def test_extraction_servers_script_writes_servers_yaml_once_they_answer(tmp_path: Path) -> None:
    """scripts/slurm/extraction_servers.sbatch outside SLURM: stand-ins for `scontrol` (the node
    list) and `srun` (which records the server command, then serves `/v1/models` a moment
    later, like a server loading its target). The script waits for the answer, then writes the
    servers.yaml the README merges over the config."""
    port = free_port()
    site = tmp_path / "site"
    (site / "v1").mkdir(parents=True)
    (site / "v1" / "models").write_text("{}")
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (stand_ins / "srun").write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/srun.args\nsleep 1\n'
        f"exec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {site}\n"
    )
    for stand_in in stand_ins.iterdir():
        stand_in.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    write_config(work, {"target": {"max_model_len": 2048}})
    env = {**os.environ, "PATH": f"{stand_ins}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "node1", "EAGLEFLOW_PYTHON": sys.executable}  # fmt: skip
    script = REPO / "scripts/slurm/extraction_servers.sbatch"
    states = tmp_path / "states"
    job = subprocess.Popen(["bash", str(script), "/models/Kimi-K2.5", str(states), str(port)],
                           cwd=work, env=env, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (work / "servers.yaml").exists() and job.poll() is None:
            assert time.monotonic() < deadline, "no servers.yaml after 60 s"
            time.sleep(0.5)
        servers = yaml.safe_load((work / "servers.yaml").read_text())
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait()
    urls = [f"http://127.0.0.1:{port}"]
    assert servers == {"generation": {"backend": "server", "server_url": urls},
                       "extract": {"backend": "server", "server_url": urls}}  # fmt: skip
    command = (tmp_path / "srun.args").read_text().split()
    assert command[command.index("-m") + 1 :][:2] == ["eagleflow.extraction_server",
                                                      "/models/Kimi-K2.5"]  # fmt: skip
    assert " --config config.yaml --storage " in " ".join(command)
    assert command[command.index("--max-model-len") + 1] == "2048" and states.is_dir()
