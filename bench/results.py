"""Run the bench scripts, then render bench/RESULTS.md from the rows every bench has stored.

Each bench script writes its figures as rows (figure, value, goal, met) with the date, its
command, the machine, its time and memory to bench/figures/NAME.json (bench/rows.py). This
runs the selected scripts one at a time (on a 2-core machine two would skew each other's
timings), each with its default (quick) arguments pointed at a finished demo run (`--results`),
then renders every bench's stored rows: a section not run this time keeps its last figures,
with their date. A script that fails keeps its earlier rows, marked with the failure, and the
exit status is then 1. `faults` (kill -9 and corruption trials), `one_pass` (the workflow twice,
three drafter trainings), `fp8` (extraction, training and serving again with fp8 shards),
`recipes` (a drafter trained per recipe variant), `peer` (speculators' trainer, then both
drafters served), `kernel_cache` and `muon` (trainings) are long and run only when named in
`--only`; bench/gpu.py runs on a GPU machine and its stored rows are rendered like the others.

    .venv/bin/python bench/results.py --results results       # the default benches, render
    .venv/bin/python bench/results.py --only fp8 --results RUN/results
    .venv/bin/python bench/results.py --render-only           # RESULTS.md from the stored rows
"""

from __future__ import annotations

import argparse
import ast
import json
import shlex
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rows import MIB, REPO, STORED, command_line, load, markdown_table, now, shown_path

Arguments = Callable[[argparse.Namespace], list[str]]


@dataclass
class Bench:
    name: str  # bench/NAME.py, bench/figures/NAME.json
    arguments: Arguments
    by_default: bool = True


def model_args(args: argparse.Namespace) -> list[str]:
    return ["--model", str(args.model), "--prompts", str(args.prompts)]


def results_args(args: argparse.Namespace) -> list[str]:
    return ["--results", str(args.results)]


def reference_args(args: argparse.Namespace) -> list[str]:
    """The finished run `--results` belongs to (benches that rerun the workflow in a copy)."""
    return ["--reference", str(args.results.resolve().parent)]


def dag_args(args: argparse.Namespace) -> list[str]:
    noop = ["--noop-workdir", str(args.noop_workdir)] if args.noop_workdir else []
    return ["--shards", args.dag_shards, *noop]


BENCHES = [
    Bench("extraction", model_args),
    Bench(
        "extraction_scaling",
        lambda a: [
            "--model",
            str(a.model),
            "--samples",
            str(a.results / "tokens/shard-00000.jsonl"),
        ],
    ),
    Bench("projection", results_args),
    Bench("training", results_args),
    Bench("kernel_cache", results_args, by_default=False),
    Bench("muon", results_args, by_default=False),
    Bench("generation", model_args),
    Bench("acceptance", results_args),
    Bench("draft_sampling", results_args, by_default=False),
    Bench("sampling_limits", results_args, by_default=False),
    Bench("dag_scale", dag_args),
    Bench("one_pass", reference_args, by_default=False),
    Bench("codecs", model_args),
    Bench(
        "chunk_io",
        lambda a: ["--shard", str(a.results / "hidden/shard-00000.zarr"), "--rounds", "15"],
    ),
    Bench("fp8", reference_args, by_default=False),
    Bench("recipes", results_args, by_default=False),
    Bench("peer", results_args, by_default=False),
    Bench(
        "faults",
        lambda a: ["--reference", str(a.faults_reference)] if a.faults_reference else [],
        by_default=False,
    ),
]


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no stderr)"


def run_bench(bench: Bench, args: argparse.Namespace) -> str | None:
    """Run one bench script (its stderr to the console); None, or why it failed."""
    stored = args.rows_dir / f"{bench.name}.json"
    command = [sys.executable, str(REPO / "bench" / f"{bench.name}.py"), *bench.arguments(args)]
    if args.rows_dir != STORED:
        command += ["--rows", str(stored)]
    print(f"\n=== {bench.name}: {shlex.join(map(shown_path, command))}", flush=True)
    before = stored.stat().st_mtime_ns if stored.exists() else None
    tail: deque[str] = deque(maxlen=50)
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as proc:
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)
    if proc.returncode != 0:
        error = f"exit {proc.returncode}: {last_line(''.join(tail))}"
    elif not stored.exists() or stored.stat().st_mtime_ns == before:
        error = f"exit 0 but no rows written to {shown_path(stored)}"
    else:
        return None
    # The earlier rows stay, marked: the section shows both.
    record = json.loads(stored.read_text()) if stored.exists() else {}
    record["failed"] = {"date": now(), "command": command_line(command[1:]), "error": error}
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps(record, indent=1) + "\n")
    return error


def description(name: str) -> str:
    """The first paragraph of a bench script's docstring (read, not imported)."""
    path = REPO / "bench" / f"{name}.py"
    if not path.is_file():
        return ""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def run_facts(record: dict, machine: str) -> str:
    facts = [f"on machine {machine}"]
    if record.get("seconds") is not None:
        facts.append(f"{record['seconds']:,.0f} s")
    if record.get("max_process_rss"):
        facts.append(f"largest process {record['max_process_rss'] / MIB:,.0f} MiB")
    return f"Run {record['date']}, {', '.join(facts)}: `{record['command']}`"


def render(records: dict[str, dict]) -> str:
    """RESULTS.md: how it was made, the machines, then one section per bench."""
    machines: list[tuple[str, ...]] = []
    for record in records.values():
        if record.get("machine") and tuple(record["machine"]) not in machines:
            machines.append(tuple(record["machine"]))
    goals = [row.met for r in records.values() for row in r["rows"] if row.met is not None]
    failed = [name for name, r in records.items() if "failed" in r]
    lines = [
        "# Benchmark results",
        "",
        "Generated by `bench/results.py` from the rows each bench script stores in "
        "`bench/figures/NAME.json`: its figures against their goals, with the date, the command "
        "and the machine. A section keeps the figures of its bench's last run until it runs "
        "again. Scripts run one at a time, with their default (quick) settings unless the "
        "command says otherwise; compare rows within a section, not across machines. "
        "`.venv/bin/python bench/results.py --results results` runs the default benches and "
        "renders this file, `--only NAME` runs one, `--render-only` none.",
        "",
        f"Goals met: {sum(goals)} of {len(goals)}."
        + (f" Last run failed: {', '.join(failed)}." if failed else ""),
        "",
        "Machines:",
        "",
    ]
    for i, machine in enumerate(machines):
        lines.append(f"- {chr(ord('A') + i)}:")
        lines += [f"  - {line}" for line in machine]
    for name, record in records.items():
        source = f"bench/{name.split('.')[0]}.py"
        lines += ["", f"## {record.get('title', name)}", ""]
        if text := description(name):
            lines += [f"{text} (`{source}`)", ""]
        if failure := record.get("failed"):
            lines += [f"Last run failed ({failure['date']}): `{failure['command']}`: "
                      f"{failure['error']}", ""]  # fmt: skip
        if not record["rows"]:
            lines.append("No figures stored yet.")
            continue
        machine = chr(ord("A") + machines.index(tuple(record["machine"])))
        lines += [run_facts(record, machine), ""]
        if record.get("note"):
            lines += [record["note"], ""]
        lines.append(markdown_table(record["rows"], source))
    return "\n".join(lines) + "\n"


def main() -> None:
    names = [bench.name for bench in BENCHES]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--results", type=Path, default=Path("results"), help="a finished demo run's results"
    )
    parser.add_argument("--model", type=Path, help="target (default: RESULTS/demo/target)")
    parser.add_argument(
        "--prompts", type=Path, help="prompts (default: RESULTS/prompts/prompts.jsonl)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--skip", nargs="+", choices=names, metavar="NAME", help=f"of: {', '.join(names)}"
    )
    which.add_argument("--only", nargs="+", choices=names, metavar="NAME", help="run only these")
    which.add_argument("--render-only", action="store_true", help="run nothing, only render")
    parser.add_argument(
        "--dag-shards", default="100,1000,5000", help="dag_scale: shard counts to plan"
    )
    parser.add_argument(
        "--noop-workdir",
        type=Path,
        help="dag_scale: finished workflow directory for the no-op run "
        "(default: the one holding RESULTS, if it has a config.yaml)",
    )
    parser.add_argument(
        "--faults-reference",
        type=Path,
        help="faults: a finished run (default: faults.py makes one)",
    )
    parser.add_argument(
        "--rows-dir", type=Path, default=STORED, help="stored rows (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    args = parser.parse_args()
    args.model = args.model or args.results / "demo" / "target"
    args.prompts = args.prompts or args.results / "prompts" / "prompts.jsonl"
    if args.noop_workdir is None:
        holder = args.results.resolve().parent
        args.noop_workdir = holder if (holder / "config.yaml").is_file() else None

    if args.render_only:
        selected = []
    elif args.only:
        selected = [b for b in BENCHES if b.name in args.only]
    else:
        selected = [b for b in BENCHES if b.by_default and b.name not in (args.skip or [])]
    failed = [b.name for b in selected if run_bench(b, args)]

    # Every bench's stored rows, in BENCHES' order, then any other (bench/gpu.py's). A bench's
    # further row files (NAME.PART.json, from a run with --rows) follow its own.
    paths = {p.stem: p for p in sorted(args.rows_dir.glob("*.json"))}
    order = [s for n in names for s in paths if s.split(".")[0] == n]
    order += [s for s in paths if s not in order]
    records = {name: load(paths[name]) for name in order}
    args.out.write_text(render(records))
    print(f"\nwrote {shown_path(args.out)}: {len(records)} sections, from the rows in "
          f"{shown_path(args.rows_dir)}")  # fmt: skip
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
