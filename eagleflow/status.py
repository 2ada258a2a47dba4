"""Extraction progress and disk projection, from what is on disk (never from one sample).

    python -m eagleflow.status [--results results] [--json]

The projection is raw bytes of all tokens (exact once `prepare` has run, an estimate from the
plan before) divided by the compression ratio measured on the shards done so far. One script
in the reference run extrapolated from a single sample and was 35% low; this one measures.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from eagleflow.files import read_jsonl, tree_bytes
from eagleflow.logs import InputError
from eagleflow.shards import LOSSY_CODECS, raw_bytes_per_token
from eagleflow.target_config import target_text_config

# (2, N//2, N-3), the aux layers vLLM, SGLang and EAGLE use by default.
DEFAULT_AUX_LAYERS = 3


def uncompressed_ratio(codec: str | None, num_aux: int, hidden_size: int) -> float:
    """Raw (bf16) over stored bytes of a codec whose compressor gains nothing: 1 for lossless
    codecs, about 2 for fp8 codes (a byte per value; the per-chunk scales are negligible).
    What a projection assumes before any shard has been measured: high, never low."""
    if codec not in LOSSY_CODECS:
        return 1.0
    raw = raw_bytes_per_token(num_aux, hidden_size)
    return raw / raw_bytes_per_token(num_aux, hidden_size, value_bytes=1)


def free_bytes(path: str | Path) -> int:
    """Free space where `path` lives. EAGLEFLOW_FREE_BYTES overrides it (tests of the
    preflight need a disk that is too small without filling a real one)."""
    if "EAGLEFLOW_FREE_BYTES" in os.environ:
        return int(os.environ["EAGLEFLOW_FREE_BYTES"])
    path = Path(path)
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _stored_bytes(store: Path, attributes: dict) -> int:
    """Bytes on disk of a store: of a finished one from its `attributes` and one stat (a store
    holds ~10^5 chunk files at the reference scale), else file by file."""
    if isinstance(attributes.get("payload_bytes"), int):
        try:
            return attributes["payload_bytes"] + (store / "zarr.json").stat().st_size
        except OSError:
            pass
    return tree_bytes(store)


@dataclass
class ExtractionStatus:
    shards_total: int
    shards_done: int
    tokens_total: int
    tokens_total_exact: bool
    tokens_done: int
    stored_bytes: int
    raw_bytes_done: int
    compression_ratio: float | None
    projected_bytes: int
    remaining_bytes: int
    tokens_per_s: float | None
    eta_s: float | None
    free_bytes: int
    rate_basis: str | None = None  # what tokens_per_s was measured on


def _finished_attributes(store: Path) -> dict:
    """A store's attributes ({} when none are readable: the status must not fail on a damaged
    or unfinished store, which verify names)."""
    try:
        attributes = json.loads((store / "zarr.json").read_text())["attributes"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return attributes if isinstance(attributes, dict) else {}


def _recorded_tokens(attributes: dict) -> int | None:
    """The token count a finished store's attributes record (None: none readable)."""
    try:
        return int(attributes["num_tokens"])
    except (KeyError, ValueError, TypeError):
        return None


class FinishedShard(NamedTuple):
    """An extracted shard; ordered by the time it finished."""

    mtime: float
    tokens: int
    stored_bytes: int
    shard: str


def _job_rate(results: Path, done: list[FinishedShard]) -> float | None:
    """Tokens per second of the finished shards' jobs, from their benchmark rows (seconds
    include the engine's start; extract, or capture in one pass)."""
    tokens = seconds = 0.0
    for finished in done:
        for rule in ("extract", "capture"):
            row = results / "benchmarks" / rule / f"shard-{finished.shard}.tsv"
            try:
                seconds += float(row.read_text().splitlines()[1].split("\t")[0])
            except (OSError, IndexError, ValueError):
                continue
            tokens += finished.tokens
            break
    return tokens / seconds if seconds else None


def shard_token_counts(
    results: Path, shards: list[dict], attributes: dict[str, dict]
) -> tuple[dict[str, int], bool]:
    """Tokens per shard: exact from the finished shard's `attributes` (by shard) or, before it
    exists, from the prepared samples (whose JSONL, at the reference scale ~3M token ids a
    shard, every extract job would otherwise parse at its start), else the plan's estimate."""
    counts, exact = {}, True
    for shard in shards:
        tokens = results / "tokens" / f"shard-{shard['shard']}.jsonl"
        finished = _recorded_tokens(attributes[shard["shard"]])
        if finished is not None:
            counts[shard["shard"]] = finished
        elif tokens.exists():
            counts[shard["shard"]] = sum(s["num_tokens"] for s in read_jsonl(tokens))
        else:
            counts[shard["shard"]] = shard["estimated_tokens"]
            exact = False
    return counts, exact


def extraction_status(
    results: str | Path,
    *,
    num_aux: int,
    hidden_size: int,
    window: int = 8,
    first_done: int | None = None,
    codec: str | None = None,
) -> ExtractionStatus:
    """Progress of the extract stage under `results/` (plan, tokens and hidden shards).

    `codec`: the configured one, for the projection before any shard is measured (None: a
    lossless one).

    `first_done` counts only that many extracted shards, those that finished first: the status
    as it stood then, to check an early projection against a finished run.
    """
    results = Path(results)
    shards = json.loads((results / "plan" / "plan.json").read_text())["shards"]
    stores = {s["shard"]: results / "hidden" / f"shard-{s['shard']}.zarr" for s in shards}
    attributes = {shard: _finished_attributes(store) for shard, store in stores.items()}
    counts, exact = shard_token_counts(results, shards, attributes)
    per_token = raw_bytes_per_token(num_aux, hidden_size)
    done = []
    for shard in shards:
        store = stores[shard["shard"]]
        if (store / "zarr.json").exists():
            size = _stored_bytes(store, attributes[shard["shard"]])
            done.append(
                FinishedShard(store.stat().st_mtime, counts[shard["shard"]], size, shard["shard"])
            )
    if first_done is not None:
        done = sorted(done)[:first_done]
    tokens_total = sum(counts.values())
    tokens_done = sum(f.tokens for f in done)
    stored = sum(f.stored_bytes for f in done)
    # Stores being written (or left by a killed job, removed when it reruns) hold space already
    # taken from what is free: not counted again as still to write.
    in_progress = sum(tree_bytes(p) for p in (results / "hidden").glob(".tmp-shard-*"))
    raw_done = tokens_done * per_token
    ratio = raw_done / stored if stored else None
    # Before any shard exists, assume no compression: a projection may be high, never low.
    floor = uncompressed_ratio(codec, num_aux, hidden_size)
    projected = int(tokens_total * per_token / (ratio or floor))
    remaining = max(projected - stored - in_progress, 0)
    rate, rate_basis = None, None
    recent = sorted(done)[-window:]
    if len(recent) >= 2 and recent[-1].mtime > recent[0].mtime:
        # Tokens finished after the first completion in the window, over the time they took.
        rate = sum(f.tokens for f in recent[1:]) / (recent[-1].mtime - recent[0].mtime)
        rate_basis = f"the last {len(recent)} shards to finish"
    elif done:  # one shard so far (a run of a few long jobs): its job's own rate
        rate = _job_rate(results, done)
        rate_basis = "one job's benchmark; jobs side by side finish sooner" if rate else None
    eta = (tokens_total - tokens_done) / rate if rate else None
    return ExtractionStatus(
        shards_total=len(shards),
        shards_done=len(done),
        tokens_total=tokens_total,
        tokens_total_exact=exact,
        tokens_done=tokens_done,
        stored_bytes=stored,
        raw_bytes_done=raw_done,
        compression_ratio=round(ratio, 4) if ratio else None,
        projected_bytes=projected,
        remaining_bytes=remaining,
        tokens_per_s=round(rate, 1) if rate else None,
        eta_s=round(eta) if eta is not None else None,
        rate_basis=rate_basis,
        free_bytes=free_bytes(results / "hidden"),  # hidden/ may be a link to another disk
    )


@dataclass
class ProjectionCheck:
    shards_total: int
    shards_measured: int  # the shards the projection was made from
    projected_bytes: int
    actual_bytes: int
    relative_error: float  # projected / actual - 1


def projection_check(
    results: str | Path, *, num_aux: int, hidden_size: int, fraction: float = 0.1
) -> ProjectionCheck:
    """On a finished run: the final size projected when only the first `fraction` of the shards
    (at least one, those that finished first) were extracted, against the size on disk."""
    final = extraction_status(results, num_aux=num_aux, hidden_size=hidden_size)
    if final.shards_done < final.shards_total or not final.tokens_total_exact:
        raise InputError(
            f"{results}: {final.shards_done}/{final.shards_total} shards extracted; the "
            "projection can be checked once the run has finished"
        )
    # Rounded first: 0.1 * 30 is 3.0000000000000004 in floats, which would ceil to 4.
    measured = max(1, math.ceil(round(fraction * final.shards_total, 6)))
    early = extraction_status(
        results, num_aux=num_aux, hidden_size=hidden_size, first_done=measured
    )
    return ProjectionCheck(
        shards_total=final.shards_total,
        shards_measured=measured,
        projected_bytes=early.projected_bytes,
        actual_bytes=final.stored_bytes,
        relative_error=round(early.projected_bytes / final.stored_bytes - 1, 5),
    )


def preflight(status: ExtractionStatus, margin_bytes: int) -> None:
    """Refuse to start extracting when what is left to write does not fit, saying by how much."""
    available = status.free_bytes - margin_bytes
    short = status.remaining_bytes - available
    if short > 0:
        raise InputError(
            f"not enough disk for extraction: {human_bytes(status.remaining_bytes)} still to "
            f"write (projected total {human_bytes(status.projected_bytes)}), "
            f"{human_bytes(status.free_bytes)} free minus a margin of "
            f"{human_bytes(margin_bytes)} (extract.disk_margin_gb): short by {human_bytes(short)}"
        )


def disk_preflight(config: dict, results: str | Path, log: logging.Logger) -> None:
    """Log the extraction status, then `preflight` with the configured margin (the first step of
    every job that writes a shard)."""
    num_aux, hidden_size = target_shape(config, results)
    codec = config["extract"]["codec"]
    status = extraction_status(results, num_aux=num_aux, hidden_size=hidden_size, codec=codec)
    log.info("before this shard:\n%s", format_status(status))
    preflight(status, margin_bytes=int(config["extract"]["disk_margin_gb"] * 1e9))


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    raise AssertionError("unreachable")


def human_seconds(seconds: float) -> str:
    """`1d 06:00:00` style: hours do not roll over at 24."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return (f"{days}d " if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def format_status(status: ExtractionStatus) -> str:
    """The status as a few lines a person reads."""
    pct = 100 * status.tokens_done / status.tokens_total if status.tokens_total else 0.0
    ratio = f"{status.compression_ratio:.3f}x" if status.compression_ratio else "n/a (no shard yet)"
    eta = human_seconds(status.eta_s) if status.eta_s else "n/a"
    if status.tokens_total and status.tokens_done == status.tokens_total:
        eta = "done"
    rate = f"{status.tokens_per_s:,.0f} tok/s" if status.tokens_per_s else "n/a"
    if status.rate_basis and status.tokens_done < status.tokens_total:
        rate += f" ({status.rate_basis})"
    total_kind = "exact" if status.tokens_total_exact else "estimated from the plan"
    return "\n".join(
        [
            f"shards    {status.shards_done}/{status.shards_total} extracted",
            f"tokens    {status.tokens_done:,}/{status.tokens_total:,} ({pct:.1f}%, total "
            f"{total_kind})",
            f"stored    {human_bytes(status.stored_bytes)} (compression {ratio})",
            f"projected {human_bytes(status.projected_bytes)} in all, "
            f"{human_bytes(status.remaining_bytes)} still to write",
            f"free disk {human_bytes(status.free_bytes)}",
            f"speed     {rate}, ETA {eta}",
        ]
    )


def target_shape(config: dict, results: str | Path) -> tuple[int, int]:
    """(aux layer count, hidden size) of the configured target."""
    model = Path(config["target"]["model"] or Path(results) / "demo" / "target")
    hidden_size = int(target_text_config(model)["hidden_size"])
    aux_ids = config.get("extract", {}).get("aux_layer_ids")
    return (len(aux_ids) if aux_ids else DEFAULT_AUX_LAYERS), hidden_size


def main(argv: list[str] | None = None) -> None:
    import yaml

    parser = argparse.ArgumentParser(description="Extraction progress and disk projection.")
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--config", default="config.yaml", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"{args.config}: no such config file (--config)")
    if not (args.results / "plan" / "plan.json").is_file():
        parser.error(f"{args.results}/plan/plan.json: not planned yet (run the workflow first)")
    config = yaml.safe_load(args.config.read_text())
    try:
        num_aux, hidden_size = target_shape(config, args.results)
    except (FileNotFoundError, InputError) as err:
        parser.error(f"the target's config.json: {err}")
    codec = (config.get("extract") or {}).get("codec")
    status = extraction_status(args.results, num_aux=num_aux, hidden_size=hidden_size, codec=codec)
    print(json.dumps(asdict(status), indent=2) if args.json else format_status(status))


if __name__ == "__main__":
    main()
