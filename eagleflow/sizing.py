"""Sizing guide: disk and shard layout of a run before it starts, or checked against one that ran.

    python -m eagleflow.sizing --layers 61 --hidden 7168 --samples 10000 --mean-tokens 1740
    python -m eagleflow.sizing --model /models/my-target --samples 10000 --mean-tokens 1740 \
        --tokens-per-s 2500 --job-hours 1
    python -m eagleflow.sizing --results results          # projection vs what is on disk

Raw bytes are exact for a given token count (`raw_bytes_per_token`: aux layers + last layer in
bf16, id and loss mask); stored bytes divide them by a compression ratio, by default the one
measured on the demo target. `--mean-tokens` is prompt + response tokens per sample. The plan
packs shards by *estimated* tokens (prompt + `plan.expected_response_tokens`), so set that key
near your expected mean response length or the shard count will differ from this one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from eagleflow.layers import default_layer_ids
from eagleflow.logs import InputError
from eagleflow.shards import CODECS, DEFAULT_CODEC, LOSSY_CODECS, raw_bytes_per_token
from eagleflow.status import (
    DEFAULT_AUX_LAYERS,
    extraction_status,
    human_bytes,
    target_shape,
)
from eagleflow.target_config import target_text_config

# Compression ratio (raw / stored) assumed when none is given: well under the demo target's
# 1.60 with the default codec (bench/RESULTS.md, "Codecs"), as real large-model activations are
# heavier-tailed, so the projection errs towards too much disk.
# Measure yours: `--results` on a first finished run, or `python -m eagleflow.status`.
DEFAULT_RATIO = 1.25
# With the lossy fp8 codec: its codes alone (a byte per bf16 value); what zstd then gains on
# them (demo target: bench/RESULTS.md, "Storage") is not assumed.
DEFAULT_FP8_RATIO = 2.0
# Without a measured throughput, shards are sized to about this many stored bytes each: big
# enough that per-job overhead (engine start, ~minutes) is small, small enough that a failed
# or corrupt shard is cheap to redo.
DEFAULT_STORED_BYTES_PER_SHARD = 2_000_000_000
# The schema default of plan.max_samples_per_shard (tests/test_sizing.py checks they agree).
PLAN_MAX_SAMPLES_PER_SHARD = 2000


@dataclass
class Sizing:
    num_layers: int | None
    hidden_size: int
    num_aux: int
    samples: int
    mean_tokens: float
    codec: str
    compression_ratio: float
    ratio_assumed: bool  # no --ratio: the codec's default assumption, not a measurement
    raw_bytes_per_token: int
    tokens: int
    raw_bytes: int
    stored_bytes: int
    tokens_per_s: float | None
    shard_basis: str  # "job length" (from throughput) or "stored size"
    shard_tokens: int
    shards: int
    samples_per_shard: float
    raw_bytes_per_shard: int
    stored_bytes_per_shard: int
    hours_per_shard: float | None
    extraction_hours: float | None  # all shards, one job at a time
    config: dict  # the config.yaml keys that give this layout


def project(
    *,
    hidden_size: int,
    samples: int,
    mean_tokens: float,
    num_aux: int = DEFAULT_AUX_LAYERS,
    ratio: float | None = None,
    tokens_per_s: float | None = None,
    job_hours: float = 1.0,
    num_layers: int | None = None,
    codec: str = DEFAULT_CODEC,
) -> Sizing:
    """Bytes of a run and a shard size: one job of `job_hours` at `tokens_per_s` when the
    throughput is known, else about DEFAULT_STORED_BYTES_PER_SHARD stored per shard. `ratio`
    (raw bf16 / stored) defaults to the assumption for `codec` (`default_ratio`)."""
    ratio_assumed = not ratio
    ratio = ratio or default_ratio(codec)
    per_token = raw_bytes_per_token(num_aux, hidden_size)
    tokens = round(samples * mean_tokens)
    raw = tokens * per_token
    if tokens_per_s:
        basis = "job length"
        shard_tokens = round(tokens_per_s * job_hours * 3600)
    else:
        basis = "stored size"
        shard_tokens = int(DEFAULT_STORED_BYTES_PER_SHARD * ratio // per_token)
    shard_tokens = max(shard_tokens, 1)
    # A sample longer than the budget still gets a shard of its own: never more shards than samples.
    shards = max(1, min(samples, math.ceil(tokens / shard_tokens)))
    samples_per_shard = samples / shards
    plan = {"shard_tokens": shard_tokens}
    if math.ceil(samples_per_shard) > PLAN_MAX_SAMPLES_PER_SHARD:
        # Otherwise the sample cap, not the token budget, would decide the shard size.
        plan["max_samples_per_shard"] = math.ceil(samples_per_shard)
    return Sizing(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_aux=num_aux,
        samples=samples,
        mean_tokens=mean_tokens,
        codec=codec,
        compression_ratio=ratio,
        ratio_assumed=ratio_assumed,
        raw_bytes_per_token=per_token,
        tokens=tokens,
        raw_bytes=raw,
        stored_bytes=round(raw / ratio),
        tokens_per_s=tokens_per_s,
        shard_basis=basis,
        shard_tokens=shard_tokens,
        shards=shards,
        samples_per_shard=round(samples_per_shard, 1),
        raw_bytes_per_shard=round(raw / shards),
        stored_bytes_per_shard=round(raw / ratio / shards),
        hours_per_shard=round(tokens / shards / tokens_per_s / 3600, 2) if tokens_per_s else None,
        extraction_hours=round(tokens / tokens_per_s / 3600, 1) if tokens_per_s else None,
        config={"plan": plan, **({"extract": {"codec": codec}} if codec != DEFAULT_CODEC else {})},
    )


def default_ratio(codec: str) -> float:
    """The compression ratio assumed for `codec` when none is measured or given."""
    return DEFAULT_FP8_RATIO if codec in LOSSY_CODECS else DEFAULT_RATIO


def _config_snippet(config: dict) -> list[str]:
    lines = []
    for section, keys in config.items():
        lines.append(f"{section}:")
        lines += [f"  {key}: {value}" for key, value in keys.items()]
    return lines


def format_sizing(sizing: Sizing) -> str:
    """The projection as a few lines a person reads, ending with the config to use."""
    s = sizing
    if s.num_layers and s.num_aux == DEFAULT_AUX_LAYERS:
        aux_ids, last_id = default_layer_ids(s.num_layers)
        layers = f"aux layers {', '.join(map(str, aux_ids))} + layer {last_id}"
    else:
        layers = f"{s.num_aux} aux layers + the last"
    depth = f"{s.num_layers} layers, " if s.num_layers else ""
    if s.tokens_per_s:
        basis = (
            f"one job ~{s.hours_per_shard:.2f} h at {s.tokens_per_s:,.0f} tok/s; "
            f"{s.extraction_hours:,.1f} job-hours in all"
        )
    else:
        basis = (
            f"sized for ~{human_bytes(DEFAULT_STORED_BYTES_PER_SHARD)} stored per shard; "
            "pass --tokens-per-s to size by job length"
        )
    snippet = _config_snippet(s.config)
    return "\n".join(
        [
            f"target      {depth}hidden {s.hidden_size}: {layers}, bf16",
            f"per token   {s.raw_bytes_per_token:,} B raw (activations + 5 B id and loss mask)",
            f"tokens      {s.samples:,} samples x {s.mean_tokens:,g} = {s.tokens:,}",
            f"raw         {human_bytes(s.raw_bytes)} ({s.raw_bytes:,} B)",
            f"stored      {human_bytes(s.stored_bytes)} at {s.compression_ratio:.2f}x compression "
            f"({s.codec}{', lossy' if s.codec in LOSSY_CODECS else ''}"
            f"{'; assumed: measure it, then --ratio' if s.ratio_assumed else ''})",
            f"shards      {s.shards:,} of ~{s.shard_tokens:,} tokens (~{s.samples_per_shard:,g} "
            f"samples, {human_bytes(s.raw_bytes_per_shard)} raw, "
            f"{human_bytes(s.stored_bytes_per_shard)} stored each)",
            f"            {basis}",
            f"config.yaml {snippet[0]}",
            *(f"            {line}" for line in snippet[1:]),
        ]
    )


@dataclass
class Comparison:
    quantity: str
    projected: float
    actual: float
    relative_error: float | None  # projected / actual - 1


@dataclass
class RunCheck:
    projection: Sizing
    rows: list[Comparison]
    shards: int  # in the finished run


def compare_with_run(
    results: str | Path,
    *,
    hidden_size: int,
    num_aux: int = DEFAULT_AUX_LAYERS,
    ratio: float | None = None,
    samples: int | None = None,
    mean_tokens: float | None = None,
    codec: str = DEFAULT_CODEC,
) -> RunCheck:
    """The projection next to a finished run's measured tokens and bytes on disk.

    Samples and mean tokens default to the run's own, so the error left is the ratio's alone.
    """
    results = Path(results)
    status = extraction_status(results, num_aux=num_aux, hidden_size=hidden_size, codec=codec)
    if status.shards_done < status.shards_total or not status.tokens_total_exact:
        raise InputError(
            f"--results {results}: {status.shards_done}/{status.shards_total} shards extracted; "
            "compare once the run has finished (python -m eagleflow.status shows progress)"
        )
    plan = json.loads((results / "plan" / "plan.json").read_text())
    run_samples = sum(shard["samples"] for shard in plan["shards"])
    sizing = project(
        hidden_size=hidden_size,
        num_aux=num_aux,
        ratio=ratio,
        samples=samples or run_samples,
        mean_tokens=mean_tokens or status.tokens_total / run_samples,
        codec=codec,
    )
    pairs = [
        ("samples", sizing.samples, run_samples),
        ("tokens", sizing.tokens, status.tokens_total),
        ("raw bytes", sizing.raw_bytes, status.raw_bytes_done),
        ("stored bytes", sizing.stored_bytes, status.stored_bytes),
        ("compression", sizing.compression_ratio, status.compression_ratio or 0.0),
    ]
    rows = [
        Comparison(name, projected, actual, projected / actual - 1 if actual else None)
        for name, projected, actual in pairs
    ]
    return RunCheck(projection=sizing, rows=rows, shards=status.shards_total)


def format_comparison(check: RunCheck) -> str:
    """Projection and measurement side by side, with the relative error of each."""

    def show(quantity: str, value: float) -> str:
        if "bytes" in quantity:
            return human_bytes(value)
        return f"{value:.3f}x" if quantity == "compression" else f"{value:,.0f}"

    lines = [
        f"{'':<17}{'projected':>12}{'actual':>12}{'error':>9}",
        *(
            f"{r.quantity:<17}{show(r.quantity, r.projected):>12}{show(r.quantity, r.actual):>12}"
            + (f"{r.relative_error:>+9.1%}" if r.relative_error is not None else f"{'n/a':>9}")
            for r in check.rows
        ),
        f"({check.shards:,} shards in the run; projection inputs: {check.projection.samples:,} "
        f"samples x {check.projection.mean_tokens:,.1f} tokens)",
    ]
    return "\n".join(lines)


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: a number > 0 (argparse then names the flag in the error)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _model_shape(parser: argparse.ArgumentParser, model: Path) -> tuple[int, int]:
    """(decoder layers, hidden size) from a model directory's config.json."""
    try:
        config = target_text_config(model)
        return int(config["num_hidden_layers"]), int(config["hidden_size"])
    except FileNotFoundError:
        parser.error(f"--model: no config.json in {model}")
    except (KeyError, ValueError, TypeError) as err:
        parser.error(f"--model: {model}/config.json lacks num_hidden_layers/hidden_size ({err!r})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Project the disk size and shard layout of a run (or check a finished one)."
    )
    shape = parser.add_argument_group("target shape (--model, or --hidden and --layers)")
    shape.add_argument("--model", type=Path, help="HF model directory (reads its config.json)")
    shape.add_argument(
        "--layers", type=_positive(int), help="decoder layers (shows the default aux ids)"
    )
    shape.add_argument("--hidden", type=_positive(int), help="hidden size of the target")
    shape.add_argument(
        "--num-aux", type=_positive(int), default=DEFAULT_AUX_LAYERS, help="captured aux layers"
    )
    data = parser.add_argument_group("data")
    data.add_argument("--samples", type=_positive(int), help="samples (prompt + response)")
    data.add_argument(
        "--mean-tokens", type=_positive(float), help="mean prompt + response tokens per sample"
    )
    data.add_argument(
        "--codec",
        choices=sorted(CODECS),
        help=f"extract.codec (default: the config's with --results, else {DEFAULT_CODEC})",
    )
    data.add_argument(
        "--ratio",
        type=_positive(float),
        help=f"compression ratio raw bf16 / stored (default {DEFAULT_RATIO}; "
        f"{DEFAULT_FP8_RATIO} with a lossy fp8 codec)",
    )
    jobs = parser.add_argument_group("shard size")
    jobs.add_argument(
        "--tokens-per-s", type=_positive(float), help="measured extraction throughput of one job"
    )
    jobs.add_argument(
        "--job-hours",
        type=_positive(float),
        help="wanted length of one shard job, with --tokens-per-s (default 1.0)",
    )
    parser.add_argument(
        "--results", type=Path, help="a finished run's results/: print projection vs actual"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("config.yaml"),
        help="with --results and no shape flags: the run's config, for the target's shape",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)

    if args.model and (args.layers or args.hidden):
        parser.error("--model: give either --model or --layers with --hidden, not both")
    num_layers, hidden = (
        _model_shape(parser, args.model) if args.model else (args.layers, args.hidden)
    )
    num_aux = args.num_aux
    codec = args.codec or DEFAULT_CODEC

    if args.results:
        if not (args.results / "plan" / "plan.json").is_file():
            parser.error(f"--results: {args.results}/plan/plan.json not found (no planned run)")
        if not hidden:
            import yaml

            if not args.config.is_file():
                parser.error(f"--config: {args.config} not found (or give --model or --hidden)")
            config = yaml.safe_load(args.config.read_text())
            num_aux, hidden = target_shape(config, args.results)
            codec = args.codec or (config.get("extract") or {}).get("codec") or DEFAULT_CODEC
        try:
            check = compare_with_run(
                args.results,
                hidden_size=hidden,
                num_aux=num_aux,
                ratio=args.ratio,
                samples=args.samples,
                mean_tokens=args.mean_tokens,
                codec=codec,
            )
        except InputError as err:
            sys.exit(f"error: {err}")
        print(json.dumps(asdict(check), indent=2) if args.json else format_comparison(check))
        return

    if not hidden:
        parser.error("the target's shape is needed: --model DIR, or --layers N --hidden H")
    for flag, value in (("--samples", args.samples), ("--mean-tokens", args.mean_tokens)):
        if value is None:
            parser.error(f"{flag} is required (or use --results DIR on a finished run)")
    if args.job_hours and not args.tokens_per_s:
        parser.error("--job-hours needs --tokens-per-s (the job length follows from throughput)")
    sizing = project(
        hidden_size=hidden,
        num_aux=num_aux,
        samples=args.samples,
        mean_tokens=args.mean_tokens,
        ratio=args.ratio,
        tokens_per_s=args.tokens_per_s,
        job_hours=args.job_hours or 1.0,
        num_layers=num_layers,
        codec=codec,
    )
    print(json.dumps(asdict(sizing), indent=2) if args.json else format_sizing(sizing))


if __name__ == "__main__":
    main()
