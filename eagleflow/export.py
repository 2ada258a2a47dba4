"""Drafter exports: a vLLM/SGLang-native directory and a speculators-format directory.

Every flag that an engine would otherwise guess is written explicitly: a missing
`eagle_aux_hidden_state_layer_ids` makes vLLM fall back to default ids, and a missing
`norm_before_residual` reads as True in speculators-format configs (our drafter is False).
SGLang reads its aux ids from `eagle_config` and numbers layers from 0 (its id k is the output
of decoder layer k, our id k+1), so that copy holds our ids minus one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagleflow.drafter import DrafterConfig, Eagle3Drafter
from eagleflow.files import atomic_output
from eagleflow.target_config import read_target_config

# Tensors that keep their dtype: index maps, not weights.
INDEX_TENSORS = ("d2t", "t2d")


def drafter_tensors(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Weights under the names EAGLE-3 loaders read (no `model.` prefix); embed_tokens only
    when the drafter trained its own."""
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach().cpu()
        tensors[name] = value if name in INDEX_TENSORS else value.to(dtype).contiguous()
    return tensors


def llama_layer_config(cfg: DrafterConfig) -> dict:
    """The Llama decoder-layer keys shared by both formats (read back by `drafter_config`)."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


# Architecture flags vLLM reads from the config; each written explicitly (an absent
# norm_before_residual reads as True in the speculators format).
RECIPE_FLAGS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")


def recipe_flags(cfg: DrafterConfig) -> dict[str, bool]:
    return {name: bool(getattr(cfg, name)) for name in RECIPE_FLAGS}


def drafter_config(config: dict, tensors: dict[str, torch.Tensor]) -> DrafterConfig:
    """The DrafterConfig a vLLM export's config.json was written from (`vllm_config`)."""
    return DrafterConfig(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        rms_norm_eps=config["rms_norm_eps"],
        rope_theta=config["rope_theta"],
        max_position_embeddings=config["max_position_embeddings"],
        vocab_size=config["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"],
        num_aux=tensors["fc.weight"].shape[1] // config["target_hidden_size"],
        target_hidden_size=config["target_hidden_size"],
        **{name: bool(config.get(name, False)) for name in RECIPE_FLAGS},
        own_embedding="embed_tokens.weight" in tensors,
    )


def vllm_config(model: torch.nn.Module, aux_layer_ids: list[int]) -> dict:
    cfg = model.cfg
    return {
        **llama_layer_config(cfg),
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        **recipe_flags(cfg),
        # What the drafter was trained with, for the diagnosis of an edited config.
        "eagleflow": {"trained_with": recipe_flags(cfg)},
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux_layer_ids],  # SGLang ids
        },
    }


def _write(out_dir: str | Path, config: dict, tensors: dict) -> None:
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})


def export_vllm(model: torch.nn.Module, aux_layer_ids: list[int], out_dir: str | Path) -> None:
    """config.json + model.safetensors that vLLM (method eagle3) and SGLang (EAGLE3) load."""
    _write(out_dir, vllm_config(model, aux_layer_ids), drafter_tensors(model))


def load_drafter(export_dir: str | Path) -> tuple[Eagle3Drafter, dict]:
    """The drafter exactly as `export_vllm` wrote it (float32 weights), and its config with
    `aux_layer_ids` added."""
    export_dir = Path(export_dir)
    config = json.loads((export_dir / "config.json").read_text())
    tensors = load_file(str(export_dir / "model.safetensors"))
    model = Eagle3Drafter(drafter_config(config, tensors), tensors["d2t"], tensors["t2d"])
    model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    )
    config["aux_layer_ids"] = config.get("eagle_aux_hidden_state_layer_ids") or []
    return model.eval(), config


def speculators_config(
    model: torch.nn.Module, aux_layer_ids: list[int], target: str | Path, tokens: int
) -> dict:
    cfg = model.cfg
    target_config = read_target_config(target)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        **recipe_flags(cfg),
        "torch_dtype": "bfloat16",
        "transformer_layer_config": llama_layer_config(cfg),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {
                "name_or_path": str(Path(target).resolve()),
                "architectures": target_config.get("architectures", []),
            },
        },
    }


def export_speculators(
    model: torch.nn.Module,
    aux_layer_ids: list[int],
    out_dir: str | Path,
    *,
    target: str | Path,
    num_speculative_tokens: int,
) -> None:
    """The speculators library's layout: decoder layer as `layers.0.*`."""
    tensors = {
        name.replace("midlayer.", "layers.0.", 1): value
        for name, value in drafter_tensors(model).items()
    }
    config = speculators_config(model, aux_layer_ids, target, num_speculative_tokens)
    _write(out_dir, config, tensors)
