"""The shipped demo target: the build of the default `demo_target` settings, kept in the repo.

A run whose settings equal the ones it was built with copies it (checked against the manifest's
sha256s) instead of training it: the build takes ~2.5 minutes alone on two cores and ~6 under
the test suite's load. Other settings are built. The build depends on the CPU's bf16 kernels,
so the copy also gives every machine the same target. `python -m eagleflow.demo.shipped
--check` rebuilds it here and compares; `--refresh` replaces it after a change to the build
(the tests fail until then: the manifest records the build code's sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

from eagleflow.demo import corpus, number_tasks, problem, target, word_tasks
from eagleflow.files import atomic_output, sha256_file
from eagleflow.logs import InputError

SHIPPED_DIR = Path(__file__).with_name("shipped_target")
MANIFEST = SHIPPED_DIR / "manifest.json"


def build_code_sha256() -> str:
    """One hash over the modules that decide the build's bits (corpus and its tasks, tokenizer,
    training)."""
    digest = hashlib.sha256()
    for module in (corpus, problem, number_tasks, word_tasks, target):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def shipped_manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


def _target_files(directory: Path) -> dict[str, str]:
    files = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    return {p.name: sha256_file(p) for p in files}


def copy_shipped(out_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Copy the shipped target to `out_dir` (replacing it whole), each file checked first."""
    with atomic_output(out_dir) as staging:
        staging.mkdir()
        for name, expected in manifest["files"].items():
            source = SHIPPED_DIR / name
            problem = None
            if not source.is_file():
                problem = f"listed in {MANIFEST.name} but missing"
            else:
                shutil.copyfile(source, staging / name)
                if sha256_file(staging / name) != expected:
                    problem = f"sha256 differs from {MANIFEST.name}"
            if problem:
                raise InputError(
                    f"{source}: {problem}; restore it from git "
                    "(`git checkout -- eagleflow/demo/shipped_target`)"
                )


def provide_demo_target(out_dir: str | Path, **settings: Any) -> dict[str, Any]:
    """The demo target for `settings` at `out_dir`: the shipped copy when they are the shipped
    build's, else a build. Returns the build summary and where it came from."""
    manifest = shipped_manifest()
    if settings == manifest["settings"]:
        copy_shipped(out_dir, manifest)
        return {"source": f"shipped ({manifest['built_on']})", **manifest["summary"]}
    return {"source": "built here", **target.build_demo_target(out_dir, **settings)}


def _build(out_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    summary = target.build_demo_target(out_dir, **settings)
    return {k: v for k, v in summary.items() if k != "seconds"}


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def refresh(settings: dict[str, Any]) -> dict[str, Any]:
    """Rebuild the shipped target here with `settings` and write its manifest."""
    import torch

    from eagleflow.precision import native_bf16

    with tempfile.TemporaryDirectory() as work:
        built = Path(work) / "target"
        summary = _build(built, settings)
        shutil.rmtree(SHIPPED_DIR)
        shutil.copytree(built, SHIPPED_DIR)
    manifest = {
        "settings": settings,
        "summary": summary,
        "build_code_sha256": build_code_sha256(),
        "torch": torch.__version__,
        "built_on": f"{_cpu_name()}, bf16 matmuls "
        f"{'native' if native_bf16('cpu') else 'emulated: trained in float32'}",
        "files": _target_files(SHIPPED_DIR),
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check_rebuild() -> list[str]:
    """Rebuild with the shipped settings here; the files whose bits differ from the shipped."""
    manifest = shipped_manifest()
    with tempfile.TemporaryDirectory() as work:
        built = Path(work) / "target"
        _build(built, manifest["settings"])
        files = _target_files(built)
    return sorted(n for n in manifest["files"] if files.get(n) != manifest["files"][n])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="rebuild here and compare")
    mode.add_argument("--refresh", action="store_true", help="rebuild here and ship that")
    args = parser.parse_args(argv)
    if args.refresh:
        print(json.dumps(refresh(shipped_manifest()["settings"]), indent=1))
        return
    differ = check_rebuild()
    print("rebuild here is bit-identical to the shipped target" if not differ
          else f"rebuild here differs from the shipped target in: {', '.join(differ)}")  # fmt: skip
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
