"""The full locks install what pyproject.toml pins (envs/lock.py writes them from it)."""

import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_lock_holds_every_pin_of_the_package_and_its_extras(variant: str) -> None:
    lock = _pins((REPO / f"envs/requirements-{variant}.txt").read_text().splitlines())
    extras = PYPROJECT["optional-dependencies"]
    wanted = _pins([*PYPROJECT["dependencies"], *extras[variant], *extras["workflow"]])
    wanted.update(_pins(extras["dev"]))
    mismatched = {
        name: (version, lock.get(name))
        for name, version in wanted.items()
        if lock.get(name, "").split("+")[0] != version.split("+")[0]
    }
    assert not mismatched, f"requirements-{variant}.txt: run python envs/lock.py ({mismatched})"


def test_cpu_lock_leaves_out_the_pypi_vision_and_audio_builds() -> None:
    lock = _pins((REPO / "envs/requirements-cpu.txt").read_text().splitlines())
    assert not {"torchvision", "torchaudio", "torchcodec", "crc32c"} & lock.keys()
    assert lock["torch"] == "2.13.0+cpu"
