"""The target in transformers, for the hf backends of generation and extraction, also when its
text decoder sits inside a multimodal wrapper (Kimi-K2.5, Qwen2.5-VL: the decoder's settings
under `text_config`, its weights under `language_model.*`), which `AutoModelForCausalLM` does
not load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagleflow.logs import InputError
from eagleflow.target_config import read_target_config


def load_causal_lm(model_dir: str | Path, *, dtype: Any, trust_remote_code: bool = False) -> Any:
    """The target as a transformers model that generates text, in `dtype`: a causal LM, or for
    a wrapper its image-text-to-text class (the wrapper's own weight renames then apply; its
    vision tower is loaded too, and never run). `.get_decoder()` is the text decoder."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    wrapped = "text_config" in read_target_config(model_dir)
    auto = AutoModelForImageTextToText if wrapped else AutoModelForCausalLM
    try:
        return auto.from_pretrained(model_dir, dtype=dtype, trust_remote_code=trust_remote_code)
    except ValueError as err:  # a config class the auto class has no model for
        kind = "multimodal wrapper" if wrapped else "causal LM"
        reason = str(err).splitlines()[0]
        raise InputError(
            f"target.model: {model_dir}: transformers cannot load this {kind}: {reason}"
        ) from None
