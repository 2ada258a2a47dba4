"""Extraction inside the workflow: verify, one-command repair, crash safety, params reruns."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from conftest import (
    REPO,
    TRAINING_AND_DOWNSTREAM,
    free_port,
    run_snakemake,
    scheduled_outputs,
    write_config,
)

from eagleflow.capture import ShardFormat, generate_and_capture_shard
from eagleflow.compare import compare_shards, format_comparison
from eagleflow.extraction_server import running_server
from eagleflow.files import read_jsonl
from eagleflow.generate import Sampling
from eagleflow.shards import open_shard


def hidden_stores(workdir: Path) -> dict[str, Path]:
    plan = json.loads((workdir / "results/plan/plan.json").read_text())
    return {s["shard"]: workdir / f"results/hidden/shard-{s['shard']}.zarr" for s in plan["shards"]}


def verify(workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eagleflow.verify", "--results", "results"],
        cwd=workdir,
        capture_output=True,
        text=True,
    )


def test_demo_shards_verify_clean_with_the_documented_attributes(demo_run: Path) -> None:
    result = verify(demo_run)
    assert result.returncode == 0, result.stdout
    stores = hidden_stores(demo_run)
    assert f"all {len(stores)} shards clean" in result.stdout
    attrs = open_shard(stores["00000"]).attrs
    assert attrs["aux_layer_ids"] == [2, 4, 5] and attrs["last_layer_id"] == 8
    assert attrs["logical_dtype"] == "bfloat16" and attrs["backend"] == "vllm"
    for key in ("target_fingerprint", "tokenizer_fingerprint", "backend_version"):
        assert attrs[key], key


def test_changed_layer_ids_rerun_every_extract_job_only(demo_copy: Path) -> None:
    write_config(demo_copy, {"extract": {"aux_layer_ids": [1, 4, 6]}})
    dry = run_snakemake(demo_copy, "-n").stdout
    write_config(demo_copy, {"extract": {"aux_layer_ids": [2, 4, 8]}})
    bad = run_snakemake(demo_copy, "-n", check=False)
    stores = hidden_stores(demo_copy)
    assert scheduled_outputs(dry, "results/") == sorted(
        [f"results/hidden/shard-{s}.{ext}" for s in stores for ext in ("zarr", "sha256")]
        + TRAINING_AND_DOWNSTREAM
    )
    assert "Params have changed since last execution" in dry
    assert bad.returncode != 0
    assert "extract.aux_layer_ids: layer id 8 appears more than once" in bad.stdout + bad.stderr


def test_extraction_refuses_to_start_without_disk(demo_copy: Path) -> None:
    stores = hidden_stores(demo_copy)
    shutil.rmtree(stores["00000"])
    env_free = "EAGLEFLOW_FREE_BYTES=1000000"
    result = subprocess.run(
        f"{env_free} {shlex.quote(sys.executable)} -m snakemake --snakefile "
        f"{shlex.quote(str(REPO / 'Snakefile'))} --cores 2 hidden",
        shell=True,
        cwd=demo_copy,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    log = (demo_copy / "results/logs/extract/shard-00000.log").read_text()
    assert "not enough disk for extraction" in log and "short by" in log
    assert "(extract.disk_margin_gb)" in log  # the message names the key that sets the margin
    assert not stores["00000"].exists()


def test_repaired_shard_that_comes_back_different_makes_its_dependants_stale(
    demo_copy: Path,
) -> None:
    """The other branch of the repair: when the regenerated store differs from the manifest
    recorded when training consumed it (here the record is altered: the store is rebuilt
    identical to the altered record's original), its new mtime makes exactly the training and
    what follows stale, and the repair says so."""
    store = hidden_stores(demo_copy)["00001"]
    manifest = store.with_suffix(".sha256")
    lines = manifest.read_text().splitlines()
    digest, name = lines[0].split("  ", 1)
    lines[0] = f"{'0' * len(digest)}  {name}"  # as if the consumed store had other bytes
    manifest.write_text("\n".join(lines) + "\n")
    shutil.rmtree(store / "aux")  # and damage the store
    repair = subprocess.run(
        [sys.executable, "-m", "eagleflow.repair", "results/hidden/shard-00001.zarr",
         "--cores", "2", "--", "--snakefile", str(REPO / "Snakefile")],
        cwd=demo_copy, capture_output=True, text=True,
    )  # fmt: skip
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "repair: rerun extract -> results/hidden/shard-00001.zarr" in repair.stdout
    assert "results/hidden/shard-00001.zarr came back different (content differs)" in repair.stdout
    assert "now stale, to be rerun by `snakemake`: evaluate_offline, evaluate_serving, " \
        "report_plots, train" in repair.stdout  # fmt: skip
    dry = run_snakemake(demo_copy, "-n").stdout
    assert scheduled_outputs(dry, "results/") == sorted(TRAINING_AND_DOWNSTREAM)


def test_changed_generation_key_reschedules_extraction_downstream(demo_copy: Path) -> None:
    write_config(demo_copy, {"generation": {"max_new_tokens": 200}})
    dry = run_snakemake(demo_copy, "-n").stdout
    assert len(scheduled_outputs(dry, "results/hidden/")) == 2 * len(hidden_stores(demo_copy))


def test_servers_extract_every_shard_and_one_dying_mid_shard_is_named(
    demo_run: Path, demo_copy: Path, tmp_path: Path
) -> None:
    """Shard jobs send their prefills to extraction servers (`extract.server_url`: a list, one
    per node): shard k goes to server k mod 2, each server is checked before its states are used,
    and the states equal the in-process engine's within bf16 rounding. When a server dies in the
    middle of a shard, that job fails with one line naming it and keeps nothing; its rerun starts
    on the server that still answers, which has then served every shard job with one model
    load. The same server also serves one-pass generation."""
    import time

    from faults import snakemake_command

    stores = hidden_stores(demo_copy)
    assert sorted(stores) == ["00000", "00001"]
    target = demo_copy / "results/demo/target"
    config = yaml.safe_load((demo_copy / "config.yaml").read_text())
    storage = [tmp_path / "states-a", tmp_path / "states-b"]
    # Each port is picked just before its server starts (b's once a is up), so that no other
    # process can take it in the meantime.
    with (
        running_server(target, port=free_port(), log_path=tmp_path / "a.log",
                       extract_layer_ids=[2, 4, 5, 8], storage_dir=storage[0]) as url_a,
        running_server(target, port=free_port(), log_path=tmp_path / "b.log",
                       extract_layer_ids=[2, 4, 5, 8], storage_dir=storage[1]) as url_b,
    ):  # fmt: skip
        config["extract"] = {"backend": "server", "server_url": [url_a, url_b]}
        (demo_copy / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        run_snakemake(demo_copy, "hidden")  # the changed backend reruns every extract job
        assert open_shard(stores["00000"]).attrs["server_url"] == url_a
        assert open_shard(stores["00001"]).attrs["server_url"] == url_b
        compare_with_in_process(stores, demo_run, demo_copy)

        # Server b dies while it prefills shard 00001 (its states appear in its storage).
        before = set(storage[1].iterdir())
        job = subprocess.Popen(
            snakemake_command(
                demo_copy, "--forcerun", "extract", "--", "results/hidden/shard-00001.zarr"
            ),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while not set(storage[1].iterdir()) - before and time.monotonic() < deadline:
            assert job.poll() is None, job.communicate()[0][-3000:]
            time.sleep(0.02)
        _kill_server_on(int(url_b.rsplit(":", 1)[1]))
        output = job.communicate(timeout=600)[0]
        assert job.returncode != 0
        log = (demo_copy / "results/logs/extract/shard-00001.log").read_text()
        assert f"extraction server {url_b} failed during the job" in log, log[-2000:]
        assert not stores["00001"].exists(), output[-2000:]
        assert not [p for p in stores["00001"].parent.iterdir() if "tmp" in p.name]

        # The rerun finds b gone (named in the job's log) and finishes the shard on a.
        run_snakemake(demo_copy, "hidden")
        assert open_shard(stores["00001"]).attrs["server_url"] == url_a
        log = (demo_copy / "results/logs/extract/shard-00001.log").read_text()
        assert f"extraction server {url_b} is unreachable" in log
        one_pass_through_the_server(url_a, demo_run, tmp_path)
    loads = (tmp_path / "a.log").read_text().count("Starting to load model")
    print(f"server a: {loads} model load for 2 shard jobs, a rerun and one-pass generation")
    assert loads == 1
    assert verify(demo_copy).returncode == 0
    compare_with_in_process(stores, demo_run, demo_copy)


def compare_with_in_process(stores: dict[str, Path], demo_run: Path, demo_copy: Path) -> None:
    """Served shards hold the in-process run's samples and token ids, and states within bf16
    rounding of its states (other batch shapes may round a bf16 result differently)."""
    identical = compared = 0
    for shard, path in stores.items():
        served = open_shard(path)
        reference = open_shard(demo_run / path.relative_to(demo_copy))
        assert served.attrs["backend"] == "server"
        assert list(served.sample_ids) == list(reference.sample_ids)
        for ours, theirs in zip(served.iter_samples(), reference.iter_samples(), strict=True):
            assert torch.equal(ours["input_ids"], theirs["input_ids"])
            for name in ("aux", "last"):
                a, b = ours[name].float(), theirs[name].float()
                assert (a - b).norm() <= 0.02 * b.norm(), (shard, ours["sample_id"], name)
                identical += int(torch.equal(a, b))
                compared += 1
    print(f"server vs in-process states: {identical}/{compared} arrays bit-identical")


def one_pass_through_the_server(url: str, demo_run: Path, tmp_path: Path) -> None:
    """One pass in server mode: generation requests to the same extraction server return the
    states of prompt and answer too (the smallest shard of the run)."""
    stores = hidden_stores(demo_run)
    shard = min(stores, key=lambda s: open_shard(stores[s]).num_tokens)
    summary = generate_and_capture_shard(
        demo_run / f"results/plan/shard-{shard}.jsonl",
        demo_run / "results/demo/target",
        tmp_path / "responses.jsonl",
        tmp_path / "shard.zarr",
        backend="server",
        sampling=Sampling(0.0, 1.0, 256, 0),  # the config's, defaults all
        on_truncated="keep",
        max_model_len=1024,
        shard_format=ShardFormat(max_len=1024),
        server_url=url,
        server_concurrency=4,
    )
    print(summary)
    served = open_shard(tmp_path / "shard.zarr")
    assert served.attrs["backend"] == "server" and served.attrs["capture"] == "during_generation"
    records = {r["id"]: r for r in read_jsonl(tmp_path / "responses.jsonl")}
    for sample in served.iter_samples():
        record = records[sample["sample_id"]]
        assert (
            sample["input_ids"].tolist()
            == record["prompt_token_ids"] + record["response_token_ids"]
        )
    # The server's engine is compiled, the run's generation eager: answers may part, but only
    # at greedy near-ties of the target; where the ids agree, so must the states.
    comparison = compare_shards(
        tmp_path / "shard.zarr", stores[shard], target=demo_run / "results/demo/target"
    )
    print(f"one pass, server vs separate pass:\n{format_comparison(comparison)}")
    assert comparison.samples_compared == served.num_samples
    assert comparison.identical_ids >= comparison.samples_compared // 2
    assert comparison.ok, comparison.ids_differ


def _kill_server_on(port: int) -> None:
    """SIGKILL the process group of whatever listens on `port` (a server dying on its node)."""
    import os
    import signal

    import psutil

    for connection in psutil.net_connections(kind="tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status == "LISTEN":
            os.killpg(os.getpgid(connection.pid), signal.SIGKILL)
            return
    raise AssertionError(f"nothing listens on port {port}")
