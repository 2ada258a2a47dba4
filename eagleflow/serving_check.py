"""The serving check: the held-out prompts served in vLLM with the drafter at each temperature,
measured against the offline estimate (eagleflow/evaluate.py), with losslessness at T > 0
(eagleflow/sampled.py) and the export's known faults diagnosed (eagleflow/diagnose.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagleflow.evaluate import heldout_prompts
from eagleflow.files import write_json
from eagleflow.logs import InputError
from eagleflow.sampled import (
    ACCEPTANCE_SIGMAS,
    acceptance_length_stderr,
    engine_fault,
    served_without_drafter,
)
from eagleflow.sampling import (
    UNLIMITED,
    SamplingLimits,
    data_sampling_unserved,
    sampled_as_data,
)


def serving_acceptance(
    export_dir: str | Path,
    shard_paths: Sequence[str | Path],
    target: str | Path,
    *,
    heldout_fraction: float,
    k: int,
    max_tokens: int,
    max_model_len: int,
    max_prompts: int | None = None,
    temperatures: Sequence[float] = (0.0,),
    compare_plain: bool = True,
    engine_options: Mapping[str, Any] | None = None,
    server_url: str | None = None,
    draft_sample_method: str = "greedy",
    limits: SamplingLimits = UNLIMITED,
) -> dict:
    """Generation of the held-out prompts in vLLM with the drafter at each of `temperatures`
    (prompt i seeded i; `limits` at T > 0) and, with `compare_plain`,
    without it: the speed-up, identical greedy outputs, and at T > 0 whether the drafter left
    the output distribution as the target's (eagleflow/sampled.py); `engine_options`: the
    user's, for both engines; `draft_sample_method`: how the engine drafts when sampling
    (vLLM's). With `server_url` (a vLLM server serving the target with the drafter) no engine
    is built here and nothing is compared without the drafter. Returns the first
    temperature's figures at the top level, every temperature's under `by_temperature`."""
    from eagleflow.spec_decode import Served, eagle3_config, generate_with_drafter_server, serve

    temperatures = [float(t) for t in temperatures]
    prompts = heldout_prompts(shard_paths, heldout_fraction, max_prompts)
    start = time.perf_counter()
    if server_url:
        runs = [
            generate_with_drafter_server(
                server_url, prompts, num_speculative_tokens=k, max_tokens=max_tokens,
                temperature=t, limits=limits,
            )
            for t in temperatures
        ]  # fmt: skip
        spec = {t: Served(*run) for t, run in zip(temperatures, runs, strict=True)}
        compare_plain = False
    else:
        spec, _ = serve(
            target, prompts, max_tokens=max_tokens, max_model_len=max_model_len,
            temperatures=temperatures, options=engine_options,
            speculative_config=eagle3_config(export_dir, k, draft_sample_method),
            limits=limits,
        )  # fmt: skip
    by_temperature = {}
    for t, run in spec.items():
        acceptance = run.acceptance
        by_temperature[str(t)] = {
            "served_by": server_url or "in-process vLLM engine",
            "prompts": len(prompts),
            "k": k,
            "temperature": t,
            **(limits.as_dict() if t > 0 else {}),
            "drafts": acceptance.drafts,
            "draft_tokens": acceptance.draft_tokens,
            "accepted": acceptance.accepted_tokens,
            "mean_acceptance_length": acceptance.mean_acceptance_length,
            "per_position": acceptance.per_position_rate,
            "tokens_per_s": {"with_drafter": sum(map(len, run.outputs)) / run.seconds},
        }
    if compare_plain:
        plain, verdicts = served_without_drafter(
            target, prompts, {t: run.outputs for t, run in spec.items() if t > 0},
            temperatures=temperatures, max_tokens=max_tokens, max_model_len=max_model_len,
            options=engine_options, limits=limits,
        )  # fmt: skip
        for t, run in plain.items():
            record = by_temperature[str(t)]
            record["tokens_per_s"]["without_drafter"] = sum(map(len, run.outputs)) / run.seconds
            if t == 0:  # greedy with and without speculation agree but for rare bf16 near-ties
                record["identical_outputs"] = sum(
                    a == b for a, b in zip(run.outputs, spec[t].outputs, strict=True)
                )
            else:
                record["lossless"] = verdicts[t]
    else:
        for t in temperatures:
            if t > 0:
                by_temperature[str(t)]["lossless"] = {
                    "lossless": None,
                    "reason": "not checked: no run without the drafter (server backend or "
                    "compare_plain: false)",
                }
    report = {
        **by_temperature[str(temperatures[0])],
        "by_temperature": by_temperature,
        "seconds": time.perf_counter() - start,
    }
    return report


class ServingCheckFailed(InputError):
    """Served acceptance fell short of the offline estimate, or the export has a known fault."""


def serving_check(
    out_path: str | Path,
    *,
    offline: dict,
    export_dir: str | Path,
    shard_paths: Sequence[str | Path],
    target: str | Path,
    heldout_fraction: float,
    k: int,
    tolerance: float,
    max_prompts: int | None,
    max_tokens: int,
    max_model_len: int,
    temperatures: Sequence[float] = (0.0,),
    data_temperature: float = 0.0,
    compare_plain: bool = True,
    engine_options: Mapping[str, Any] | None = None,
    server_url: str | None = None,
    other_ks: Sequence[int] = (),
    draft_sample_method: str = "greedy",
    limits: SamplingLimits = UNLIMITED,
    data_limits: SamplingLimits = UNLIMITED,
) -> dict:
    """Measure served acceptance at each of `temperatures` (at T > 0 with `limits`, vLLM's
    top_k and top_p), in vLLM engines built here or on the vLLM server at `server_url`; write the
    report only when the drafter passes.

    It fails when served mean acceptance length at some temperature is below that
    temperature's offline (answer-only) estimate by more than `tolerance` (relative), when the
    estimate is comparable: the data were sampled as served (`data_temperature`, `data_limits`:
    the config's generation section; the walk follows the data's contexts, and a
    drafter served otherwise meets contexts it was not trained on, so the estimate there only
    informs: a shortfall is a warning in the report and the log; a check that would gate no
    temperature is refused before serving). It also fails when the
    outputs sampled with the drafter are not distributed as the target's own (an engine fault:
    a drafter cannot change them in a correct engine), or when a diagnostic finds a known
    fault in the export; the findings go into the error and into `<out>.rejected.json`.
    `other_ks`: further K served at the data's temperature and gated alike (`by_k`), each in an
    engine of its own (not with a server: it serves one K). `draft_sample_method`: vLLM's, as
    the offline estimate assumed it (a server drafts as it was started).
    """
    from eagleflow.diagnose import diagnose_export

    if str(k) not in offline["by_k"]:
        raise InputError(
            f"evaluate.serving_k: {k} is not among the offline ks {list(offline['by_k'])}"
        )
    unknown = [n for n in (k, *other_ks) if str(n) not in offline["by_k"]]
    if unknown:
        raise InputError(
            f"evaluate.other_served_ks: {unknown} not among the offline ks {list(offline['by_k'])}"
        )
    estimated = offline.get("draft_sample_method", "greedy")
    if estimated != draft_sample_method:
        raise InputError(
            f"evaluate.draft_sample_method: {draft_sample_method!r}, but the offline estimate "
            f"assumed {estimated!r}; rerun evaluate_offline"
        )
    assumed = SamplingLimits.of(offline)
    if assumed != limits:
        raise InputError(
            f"evaluate.top_k / top_p: {limits.top_k} / {limits.top_p:g}, but the offline "
            f"estimate assumed {assumed.top_k} / {assumed.top_p:g}; rerun evaluate_offline"
        )
    missing = [t for t in temperatures if str(float(t)) not in offline.get("by_temperature", {})]
    if missing:
        raise InputError(
            f"evaluate.temperatures: no offline estimate at {missing}; rerun evaluate_offline"
        )
    ungated = data_sampling_unserved(temperatures, limits, data_temperature, data_limits)
    if ungated:
        raise InputError(ungated)
    from eagleflow.spec_decode import cpu_serving_blocked

    blocked = None if server_url else cpu_serving_blocked(target)
    if blocked:
        raise InputError(f"serving check: {blocked}")
    problems = diagnose_export(export_dir, shard_paths, target)
    temperatures = [float(t) for t in temperatures]
    try:
        served = serving_acceptance(
            export_dir, shard_paths, target, heldout_fraction=heldout_fraction, k=k,
            max_tokens=max_tokens, max_model_len=max_model_len, max_prompts=max_prompts,
            temperatures=temperatures, compare_plain=compare_plain,
            engine_options=engine_options, server_url=server_url,
            draft_sample_method=draft_sample_method, limits=limits,
        )  # fmt: skip
    except InputError:  # the server serves no drafter, or another K: the user's to fix
        raise
    except Exception as err:  # a broken export can crash the engine: still name the cause
        served = {"error": f"{type(err).__name__}: {err}", "mean_acceptance_length": 0.0}
    failures, warnings, by_temperature = [], [], {}
    for t in temperatures:
        estimate = offline["by_temperature"][str(t)]["by_k"][str(k)]
        record = served.get("by_temperature", {}).get(str(t), served)
        gated = sampled_as_data(t, limits, data_temperature, data_limits) or "error" in served
        comparison, shortfall = gate_against_offline(record, estimate, tolerance, t, k)
        by_temperature[str(t)] = {**comparison, "gated": gated}
        if shortfall and gated:
            failures.append(shortfall)
        elif shortfall:
            data = data_limits.words(data_temperature)
            served_as = limits.words(t)
            warnings.append(
                f"{shortfall}, not gated: the data were generated at {data} (generation) "
                "and the estimate walks their contexts; served otherwise, the drafter meets "
                f"contexts it was not trained on. Generate at {served_as} to train for it "
                "and to gate it"
            )
        lossless = record.get("lossless") or {}
        if lossless.get("lossless") is False:
            prompts = heldout_prompts(shard_paths, heldout_fraction, max_prompts)
            finding = engine_fault(
                target, prompts, t, max_tokens=max_tokens, max_model_len=max_model_len,
                options=engine_options, limits=limits,
            )  # fmt: skip
            failures.append(
                f"T={t:g}: outputs sampled with the drafter are not the target's own (target "
                f"log-likelihood {lossless['loglik_with_drafter']:.3f} vs "
                f"{lossless['loglik_without_drafter']:.3f} nats/token without it, "
                f"{abs(lossless['gap']) / max(lossless['stderr'], 1e-9):.0f} standard errors): "
                + finding
            )
    by_k = {}
    if server_url and other_ks:
        warnings.append(
            f"evaluate.other_served_ks {list(other_ks)}: not served (a server serves one K)"
        )
    elif "error" not in served:
        by_k, shortfalls = served_at_other_ks(
            other_ks, offline, data_temperature, tolerance, export_dir=export_dir,
            shard_paths=shard_paths, target=target, heldout_fraction=heldout_fraction,
            max_tokens=max_tokens, max_model_len=max_model_len, max_prompts=max_prompts,
            engine_options=engine_options, draft_sample_method=draft_sample_method,
            limits=limits,
        )  # fmt: skip
        failures += shortfalls
    first = by_temperature[str(temperatures[0])]
    report = {
        **first,
        "by_temperature": by_temperature,
        "by_k": by_k,
        "tolerance": tolerance,
        "data_temperature": data_temperature,
        **{f"data_{key}": value for key, value in data_limits.as_dict().items()},
        "draft_sample_method": draft_sample_method,
        **limits.as_dict(),
        "warnings": warnings,
        "diagnostics": problems,
    }
    out_path = Path(out_path)
    if failures or problems:
        write_json(out_path.with_suffix(".rejected.json"), report)
        raise ServingCheckFailed(
            "serving check failed: " + "; ".join(failures or ["acceptance within tolerance"])
            + "; diagnostics: " + ("; ".join(problems) if problems else "no known cause found")
        )  # fmt: skip
    out_path.with_suffix(".rejected.json").unlink(missing_ok=True)
    write_json(out_path, report)
    return report


def gate_against_offline(
    record: dict, estimate: dict, tolerance: float, temperature: float, k: int
) -> tuple[dict, str | None]:
    """A served record (or a failed serving's error) against its offline estimate: the
    comparison for the report, and the shortfall when served falls below the floor, the
    estimate less `tolerance` (relative) and, sampled, less the served figure's own spread."""
    mal = record["mean_acceptance_length"]
    expected = estimate["mean_acceptance_length"]
    floor = expected * (1 - tolerance)
    noise = 0.0
    if temperature > 0 and "error" not in record:
        noise = acceptance_length_stderr(record["per_position"], record["drafts"])
        floor -= ACCEPTANCE_SIGMAS * noise
    comparison = {
        "served": record,
        "offline": estimate,
        "relative_gap": mal / expected - 1,
        "served_stderr": noise,
        "floor": floor,
    }
    if mal >= floor:
        return comparison, None
    measured = record.get("error") or f"served mean acceptance length {mal:.3f}"
    return comparison, (
        f"T={temperature:g}, K={k}: {measured} vs offline {expected:.3f} (floor {floor:.3f})"
    )


def served_at_other_ks(
    ks: Sequence[int],
    offline: dict,
    temperature: float,
    tolerance: float,
    **serving: Any,
) -> tuple[dict, list[str]]:
    """Served acceptance at each of `ks` (one engine each, at the data's temperature) against
    the offline estimate: the records by K and the shortfalls below the floor."""
    by_k, shortfalls = {}, []
    for k in ks:
        estimate = offline["by_temperature"][str(float(temperature))]["by_k"][str(k)]
        record = serving_acceptance(k=k, temperatures=[temperature], compare_plain=False, **serving)
        by_k[str(k)], shortfall = gate_against_offline(record, estimate, tolerance, temperature, k)
        shortfalls += [shortfall] if shortfall else []
    return by_k, shortfalls
