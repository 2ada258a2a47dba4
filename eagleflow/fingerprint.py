"""Fingerprints of a target model and of its tokenizer/chat template, recorded in every shard."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# A target's tokenizer vocabulary is one of these: tokenizer.json (fast tokenizers),
# tokenizer.model (sentencepiece), vocab.json (+ merges.txt, BPE), tiktoken.model (tiktoken,
# loaded by the tokenizer class the directory ships in tokenization_*.py: Kimi-K2's).
TOKENIZER_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
# Hashed for the tokenizer fingerprint, when present: the vocabulary, the chat template (in
# tokenizer_config.json or a file of its own) and any tokenizer code the directory ships.
TOKENIZER_FILES = (
    *TOKENIZER_VOCAB_FILES,
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
TOKENIZER_CODE = "tokenization_*.py"
# Model code a remote-code target ships (Kimi-K2's configuration_deepseek.py): hashed with its
# config, since it decides how the config is read.
TARGET_CODE = ("configuration_*.py", "modeling_*.py")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
FINGERPRINT_BLOCKS = 16  # blocks of each weight file read for the fingerprint
FINGERPRINT_BLOCK_BYTES = 4096


def _hash_files(digest: Any, paths: Sequence[Path], root: Path) -> None:
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())


def target_fingerprint(model_dir: str | Path) -> str:
    """A cheap fingerprint of the target's weights: never reads more than a few KiB per file.

    Hashes config.json, any weight index, the model code the directory ships, and for each
    weight file its name, size, safetensors
    header (names, dtypes, shapes, offsets) and a few evenly spaced blocks of its contents, so
    that retraining the same architecture changes it too.
    """
    root = Path(model_dir)
    digest = hashlib.sha256()
    code = sorted(path for pattern in TARGET_CODE for path in root.glob(pattern))
    _hash_files(digest, [root / "config.json", *sorted(root.glob("*.index.json")), *code], root)
    for path in sorted(p for p in root.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)):
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as stream:
            if path.suffix == ".safetensors":
                header_len = int.from_bytes(stream.read(8), "little")
                digest.update(stream.read(header_len))
            for k in range(FINGERPRINT_BLOCKS):
                stream.seek(k * max(0, size - FINGERPRINT_BLOCK_BYTES) // (FINGERPRINT_BLOCKS - 1))
                digest.update(stream.read(FINGERPRINT_BLOCK_BYTES))
    return f"sha256:{digest.hexdigest()}"


def tokenizer_fingerprint(model_dir: str | Path) -> str | None:
    """sha256 of the tokenizer and chat-template files present; None when there are none."""
    root = Path(model_dir)
    paths = [root / name for name in TOKENIZER_FILES if (root / name).is_file()]
    paths += sorted(root.glob(TOKENIZER_CODE))
    if not paths:
        return None
    digest = hashlib.sha256()
    _hash_files(digest, paths, root)
    return f"sha256:{digest.hexdigest()}"


def _package_imports(path: Path, package: str) -> set[str]:
    """The modules of `package` a source file imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name == package or name.startswith(package + ".")}


def code_modules(module: str) -> dict[str, Path]:
    """`module` and every module of its package it imports, directly or not, with their files
    (found by reading the source, not by importing, so every process gets one answer)."""
    package = module.split(".")[0]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package} is not an installed package")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    files: dict[str, Path] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        base = root.joinpath(*name.split("."))
        candidates = (base.with_suffix(".py"), base / "__init__.py")
        path = next((p for p in candidates if p.is_file()), None)
        if path is None or name in files:
            continue  # an imported name that is not a module (a function, a class)
        files[name] = path
        pending.extend(_package_imports(path, package) - files.keys())
    return files


def code_digests(module: str) -> dict[str, str]:
    """sha256 of the source of `module` and of each module of its package it imports."""
    return {
        name: hashlib.sha256(path.read_bytes()).hexdigest()
        for name, path in sorted(code_modules(module).items())
    }
