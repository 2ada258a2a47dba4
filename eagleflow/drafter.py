"""The EAGLE-3 drafter: one Llama decoder layer over the target's fused aux hidden states.

Shapes (H = hidden size, A = number of aux layers, Dv = draft vocab):
    input_norm    A*H RMSNorm before fc (norm_before_fc only)
    fc_norm.i     H RMSNorm of aux state i before fc (fc_norm only; after input_norm if both)
    fc            A*H -> H (no bias): fuses the target's aux hidden states
    midlayer      input_layernorm(embed) ++ hidden_norm(hidden) = 2H -> attention -> MLP
    norm, lm_head H -> Dv
    embed_tokens  V x H (own_embedding only; else the target's embedding, frozen)
Weight names are those vLLM's and SGLang's EAGLE-3 loaders read (no `model.` prefix). The
target's final norm and lm_head rows of the draft vocab are frozen inputs of the training
objective, never saved with the drafter; so is its embedding, unless the drafter trains its own
copy (vLLM then keeps the drafter's embed_tokens instead of sharing the target's).

Training-time test (TTT) follows vLLM's proposer: draft slot t sees embed(token t+1), position t
and fc(aux_t) and predicts token t+2; chain step k runs at position t+k, feeds back the output
of step k-1 (pre-norm; post-norm with norm_output), and attends to step 0's keys at slots <= t
plus its own earlier steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from eagleflow.logs import InputError
from eagleflow.precision import native_bf16
from eagleflow.target_config import read_target_config, target_text_config


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int  # target embedding rows
    draft_vocab_size: int
    num_aux: int
    target_hidden_size: int
    # Recipe flags, by the names vLLM's llama_eagle3 reads (all False: the original EAGLE-3).
    norm_before_fc: bool = False  # RMSNorm over the concatenated aux states before fc
    fc_norm: bool = False  # an RMSNorm per aux state before fc (EAGLE 3.1)
    norm_before_residual: bool = False  # the residual is the hidden input after hidden_norm
    norm_output: bool = False  # chain steps feed back the post-norm output
    own_embedding: bool = False  # the drafter trains and ships its token embedding

    @classmethod
    def from_target(
        cls,
        model_dir: str | Path,
        draft_vocab_size: int,
        num_aux: int,
        intermediate_scale: float = 1.0,
        **flags: bool,
    ) -> DrafterConfig:
        """Attention/MLP shapes of one target decoder layer, sized for the draft vocab, with
        the MLP `intermediate_scale` times the target's width."""
        config = target_text_config(model_dir)
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        rope = config.get("rope_parameters") or {}
        return cls(
            hidden_size=hidden,
            intermediate_size=max(1, round(int(config["intermediate_size"]) * intermediate_scale)),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            vocab_size=int(config["vocab_size"]),
            draft_vocab_size=draft_vocab_size,
            num_aux=num_aux,
            target_hidden_size=hidden,
            **flags,
        )

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 inputs: norm in fp32
        return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype
        ) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama rotary embedding (rotate-half layout) of x [B, heads, T, D] at positions [T]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_out = cfg.num_attention_heads * cfg.head_dim
        kv_out = cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = nn.Linear(2 * cfg.hidden_size, q_out, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, kv_out, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, count, self.cfg.head_dim).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: list[tuple[torch.Tensor, ...]]
    ) -> torch.Tensor:
        """x [B, T, 2H] of one chain step; `cache` holds (k, v) of the earlier steps and gets
        this step's appended. Step 0 attends causally; later steps add their own diagonal."""
        cfg = self.cfg
        q = rotate(self._heads(self.q_proj(x), cfg.num_attention_heads), positions, cfg.rope_theta)
        k = rotate(self._heads(self.k_proj(x), cfg.num_key_value_heads), positions, cfg.rope_theta)
        v = self._heads(self.v_proj(x), cfg.num_key_value_heads)
        repeat = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        cache.append((k, v))
        scale = 1.0 / math.sqrt(cfg.head_dim)
        k0, v0 = cache[0]
        length = x.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        first = (q @ k0.transpose(-1, -2)) * scale  # [B, h, T, T]
        first = first.masked_fill(~causal, float("-inf"))
        # Steps 1..k: the same slot's own earlier drafts, one score each.
        diagonal = [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in cache[1:]]
        scores = torch.cat([first, *diagonal], -1)
        weights = torch.softmax(scores, -1, dtype=torch.promote_types(q.dtype, torch.float32))
        weights = weights.to(q.dtype)
        out = weights[..., :length] @ v0
        for j, (_, vj) in enumerate(cache[1:]):
            out = out + weights[..., length + j : length + j + 1] * vj
        batch = x.shape[0]
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """vLLM's EAGLE-3 first decoder layer: the residual is the hidden input, before hidden_norm
    or (norm_before_residual) after it."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: list[tuple[torch.Tensor, ...]],
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        residual = residual + self.self_attn(x, positions, cache)
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        super().__init__()
        self.cfg = cfg
        fc_input = cfg.num_aux * cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(fc_input, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux)
            )
        self.fc = nn.Linear(fc_input, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        if cfg.own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.register_buffer("d2t", d2t.to(torch.int64))
        self.register_buffer("t2d", t2d.to(torch.bool))

    def forward(
        self, aux: torch.Tensor, input_ids: torch.Tensor, embed: nn.Embedding, steps: int
    ) -> list[torch.Tensor]:
        """Pre-norm outputs [B, T, H] of each chain step; slot t of step k predicts token t+2+k
        (its logits: `self.logits(output)`, computed by the loss only where it counts). The next
        step is fed the output, or with norm_output its normed form, as vLLM's proposer does.

        aux [B, T, A*H] from the target; input_ids [B, T]; `embed` the frozen target embedding
        (unused with own_embedding). Tokens past the end are padded with id 0: their slots are
        masked by the loss.
        """
        if self.cfg.own_embedding:
            embed = self.embed_tokens
        length = input_ids.shape[1]
        hidden = self.fuse(aux)
        cache: list[tuple[torch.Tensor, ...]] = []
        outputs = []
        for step in range(steps):
            shift = 1 + step
            tokens = F.pad(input_ids[:, shift:], (0, min(shift, length)))[:, :length]
            positions = torch.arange(length) + step
            output = self.midlayer(embed(tokens), hidden, positions, cache)
            outputs.append(output)
            hidden = self.norm(output) if self.cfg.norm_output else output
        return outputs

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The hidden input of step 0 from the target's concatenated aux states (norms in
        vLLM's order: input_norm over all, then fc_norm per aux state)."""
        if self.cfg.norm_before_fc:
            aux = self.input_norm(aux)
        if self.cfg.fc_norm:
            chunks = aux.chunk(self.cfg.num_aux, dim=-1)
            aux = torch.cat(
                [norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], -1
            )
        return self.fc(aux)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits of pre-norm outputs."""
        return self.lm_head(self.norm(hidden))


class TargetHead(nn.Module):
    """The frozen target pieces the objective needs: embedding, final norm, lm_head rows of the
    draft vocab (and a full-vocab argmax to mask positions the draft vocab cannot produce)."""

    def __init__(self, embed: torch.Tensor, norm: torch.Tensor, lm_head: torch.Tensor, eps: float):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(embed.float(), freeze=True)
        self.norm = RMSNorm(norm.shape[0], eps).requires_grad_(False)
        self.norm.weight.data.copy_(norm.float())
        # [V, H] bf16, full rows: the argmax needs every target id. A buffer, so .to() moves it.
        self.register_buffer("lm_head", lm_head, persistent=False)

    @torch.no_grad()
    def full_logits(self, last: torch.Tensor) -> torch.Tensor:
        """The target's logits over its whole vocab [..., V] from stored last-layer states, in
        the lm_head's dtype: what the teacher reads."""
        dtype = self.lm_head.dtype
        normed = self.norm(last.float()).to(dtype)
        if dtype == torch.bfloat16 and not native_bf16(normed.device):
            # The same bf16 operands, multiplied in float32 (emulated bf16 is ~10x slower).
            return (normed.float() @ self.lm_head.float().T).to(dtype)
        return normed @ self.lm_head.T

    @torch.no_grad()
    def teacher(
        self, last: torch.Tensor, draft_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs over the draft vocab [B, T, Dv] and whether the target's argmax lies in it."""
        full = self.full_logits(last)  # [B, T, V]
        in_draft = torch.zeros(full.shape[-1], dtype=torch.bool, device=full.device)
        in_draft[draft_ids] = True
        argmax_in_draft = in_draft[full.argmax(-1)]
        draft = full[..., draft_ids].float()
        return torch.log_softmax(draft, -1), argmax_in_draft


def _tensor_files(model_dir: Path) -> dict[str, Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise InputError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    with safe_open(str(single), "pt") as handle:
        return {name: single for name in handle.keys()}


# Where real checkpoints keep the decoder (its embed_tokens and norm) and the lm_head: causal
# LMs; transformers 5 wrappers (Qwen2.5-VL); Kimi-K2.5 and LLaVA-style wrappers.
DECODER_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")


def load_target_head(model_dir: str | Path) -> TargetHead:
    """Read only the embedding, final norm and lm_head of the target's safetensors, under any
    of the layouts real checkpoints use (a multimodal wrapper's included)."""
    model_dir = Path(model_dir)
    config = target_text_config(model_dir)
    wrapper = read_target_config(model_dir)
    files = _tensor_files(model_dir)

    def tensor(*names: str) -> torch.Tensor:
        for name in names:
            if name in files:
                with safe_open(str(files[name]), "pt") as handle:
                    return handle.get_tensor(name)
        raise InputError(f"{model_dir}: none of the tensors {', '.join(names)} exists")

    embed = tensor(*(prefix + "embed_tokens.weight" for prefix in DECODER_PREFIXES))
    norm = tensor(*(prefix + "norm.weight" for prefix in DECODER_PREFIXES))
    tied = config.get("tie_word_embeddings", wrapper.get("tie_word_embeddings", False))
    lm_head = embed if tied else tensor(*LM_HEAD_NAMES)
    return TargetHead(embed, norm, lm_head.to(torch.bfloat16), float(config["rms_norm_eps"]))
