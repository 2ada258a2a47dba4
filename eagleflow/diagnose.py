"""Known causes of served-acceptance collapse, checked against the artifacts.

Each check compares what the export tells the engine with what the data and the training used:
layer ids (vLLM silently falls back to defaults when they are missing), the architecture flags
against those the drafter was trained with (speculators-format readers default
norm_before_residual to True), the d2t convention (offsets, not absolute ids;
without d2t vLLM maps draft id i to target id i), the vocab sizes, and the target and chat
template the data was made with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagleflow.export import RECIPE_FLAGS
from eagleflow.fingerprint import target_fingerprint, tokenizer_fingerprint
from eagleflow.shards import open_shard
from eagleflow.target_config import target_text_config


def diagnose_export(
    export_dir: str | Path, shard_paths: Sequence[str | Path], target: str | Path
) -> list[str]:
    """One line per problem found (empty when every check passes)."""
    export_dir = Path(export_dir)
    config = json.loads((export_dir / "config.json").read_text())
    tensors = load_file(str(export_dir / "model.safetensors"))
    attrs = open_shard(shard_paths[0]).attrs
    target_config = target_text_config(target)
    problems = []

    data_ids = list(attrs["aux_layer_ids"])
    export_ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not export_ids:
        problems.append(
            f"layer ids: the export has no eagle_aux_hidden_state_layer_ids (the data holds "
            f"{data_ids}); vLLM silently falls back to its default ids"
        )
    elif list(export_ids) != data_ids:
        problems.append(f"layer ids: the export says {export_ids}, the data holds {data_ids}")

    trained = config.get("eagleflow", {}).get("trained_with", {})
    for name in RECIPE_FLAGS:
        if name not in config:
            problems.append(f"norm flag: {name} missing (trained with {trained.get(name)})")
        elif name in trained and config[name] != trained[name]:
            problems.append(
                f"norm flag: {name} is {config[name]} but the drafter was trained with "
                f"{trained[name]}"
            )
    if bool(config.get("norm_before_fc")) != ("input_norm.weight" in tensors):
        problems.append("norm flag: norm_before_fc disagrees with the presence of input_norm")
    if bool(config.get("fc_norm")) != ("fc_norm.0.weight" in tensors):
        problems.append("norm flag: fc_norm disagrees with the presence of fc_norm.*")

    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None:
        problems.append("d2t: missing; vLLM would map draft id i to target id i")
    elif t2d is not None:
        expected = t2d.nonzero().flatten()
        offsets = d2t + torch.arange(len(d2t))
        if torch.equal(d2t, expected) and not torch.equal(offsets, expected):
            problems.append(
                "d2t: written as absolute target ids; vLLM and SGLang read offsets "
                "(target id = i + d2t[i])"
            )
        elif not torch.equal(offsets, expected):
            problems.append("d2t: disagrees with t2d (i + d2t[i] must list t2d's ids)")
    if config.get("draft_vocab_size") != tensors["lm_head.weight"].shape[0]:
        problems.append(
            f"vocab: draft_vocab_size {config.get('draft_vocab_size')} but lm_head has "
            f"{tensors['lm_head.weight'].shape[0]} rows"
        )
    if config.get("vocab_size") != target_config["vocab_size"]:
        problems.append(
            f"vocab: vocab_size {config.get('vocab_size')} but the target has "
            f"{target_config['vocab_size']} embedding rows"
        )

    if attrs.get("tokenizer_fingerprint") != tokenizer_fingerprint(target):
        problems.append(
            "chat template: the data was made with another tokenizer or chat template than the "
            "target's now"
        )
    if attrs.get("target_fingerprint") != target_fingerprint(target):
        problems.append("target: the data was extracted from another target model")
    return problems
