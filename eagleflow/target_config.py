"""The one reader of a target's config.json: the decoder's settings, also inside a multimodal
wrapper (Kimi-K2.5, Qwen2.5-VL keep them under `text_config`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagleflow.logs import InputError


def read_target_config(model_dir: str | Path) -> dict:
    """A target's whole config.json (architectures, wrapper keys)."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err})") from None


def shipped_tokenizer_class(model_dir: str | Path) -> str | None:
    """The tokenizer class a target ships as code (`auto_map` of its tokenizer_config.json, e.g.
    Kimi-K2's `tokenization_kimi.TikTokenTokenizer`), or None."""
    path = Path(model_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    auto = (json.loads(path.read_text()).get("auto_map") or {}).get("AutoTokenizer")
    if isinstance(auto, list):
        auto = next((name for name in auto if name), None)
    return auto or None


def untrusted_tokenizer_code(model_dir: str | Path, trust_remote_code: bool) -> str | None:
    """Why the target cannot be used without `target.trust_remote_code`, or None. A target that
    ships its tokenizer's code must run it: transformers would otherwise build a tokenizer of
    its own from the vocabulary file (for Kimi-K2.5, with another pre-tokenizer: other ids)."""
    shipped = shipped_tokenizer_class(model_dir)
    if trust_remote_code or shipped is None:
        return None
    return (
        f"target.model: {model_dir} ships its tokenizer as code ({shipped}, auto_map in "
        "tokenizer_config.json); set target.trust_remote_code: true to run it"
    )


def target_tokenizer(model_dir: str | Path, *, trust_remote_code: bool = False, **kwargs: Any):
    """The target's tokenizer (with the code its directory ships, when trusted: Kimi-K2's
    tiktoken tokenizer is a class of its own). Refuses a shipped tokenizer class untrusted."""
    from transformers import AutoTokenizer

    refusal = untrusted_tokenizer_code(model_dir, trust_remote_code)
    if refusal:
        raise InputError(refusal)
    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code, **kwargs)


def target_text_config(model_dir: str | Path) -> dict:
    """A target's config.json, or its `text_config` for a multimodal target (the decoder)."""
    config = read_target_config(model_dir)
    return config.get("text_config", config)


def target_num_layers(model_dir: str | Path) -> int:
    """Decoder layers of a target."""
    return target_dims(model_dir)[0]


def target_dims(model_dir: str | Path) -> tuple[int, int]:
    """(decoder layers, hidden size) of a target."""
    config = target_text_config(model_dir)
    missing = [key for key in ("num_hidden_layers", "hidden_size") if key not in config]
    if missing:
        where = " (text_config)" if "text_config" in read_target_config(model_dir) else ""
        raise InputError(
            f"{Path(model_dir) / 'config.json'}: the decoder's settings{where} lack "
            f"{', '.join(missing)}"
        )
    return int(config["num_hidden_layers"]), int(config["hidden_size"])


def target_vocab_size(model_dir: str | Path) -> int:
    """Rows of the target's embedding (can exceed the tokenizer's entries)."""
    return int(target_text_config(model_dir)["vocab_size"])
