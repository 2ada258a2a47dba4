"""The one reader of a target's config.json: the decoder's settings, also inside a multimodal
wrapper (Kimi-K2.5, Qwen2.5-VL keep them under `text_config`)."""

from __future__ import annotations

import json
from pathlib import Path


def read_target_config(model_dir: str | Path) -> dict:
    """A target's whole config.json (architectures, wrapper keys)."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def target_text_config(model_dir: str | Path) -> dict:
    """A target's config.json, or its `text_config` for a multimodal target (the decoder)."""
    config = read_target_config(model_dir)
    return config.get("text_config", config)


def target_num_layers(model_dir: str | Path) -> int:
    """Decoder layers of a target."""
    return int(target_text_config(model_dir)["num_hidden_layers"])


def target_dims(model_dir: str | Path) -> tuple[int, int]:
    """(decoder layers, hidden size) of a target."""
    config = target_text_config(model_dir)
    return int(config["num_hidden_layers"]), int(config["hidden_size"])


def target_vocab_size(model_dir: str | Path) -> int:
    """Rows of the target's embedding (can exceed the tokenizer's entries)."""
    return int(target_text_config(model_dir)["vocab_size"])
