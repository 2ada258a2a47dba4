"""Drafter model, vocab map, loader order and exports, without Snakemake."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

from eagleflow.drafter import DrafterConfig, Eagle3Drafter, rotate
from eagleflow.export import RECIPE_FLAGS, export_speculators, export_vllm, load_drafter
from eagleflow.loader import SampleRef, TrainBatches, epoch_batches
from eagleflow.logs import InputError
from eagleflow.recipe import Float32Muon, WeightAverage, build_optimizer, lr_at
from eagleflow.ttt_loss import ttt_terms
from eagleflow.vocab import (
    build_vocab_map,
    check_vocab_map,
    coverage,
    draft_to_target_ids,
    resolve_draft_vocab_size,
)

CFG = DrafterConfig(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=256,
    vocab_size=50,
    draft_vocab_size=20,
    num_aux=3,
    target_hidden_size=32,
)


# Every recipe flag on its own and all together (bench/recipes.py trains each).
FLAG_SETS = [
    {},
    {"norm_before_fc": True},
    {"fc_norm": True},
    {"norm_before_residual": True},
    {"norm_output": True},
    {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True},
    {"fc_norm": True, "norm_before_residual": True, "norm_output": True},
]


def small_drafter(seed: int = 0, **flags: bool) -> tuple[Eagle3Drafter, torch.nn.Embedding]:
    torch.manual_seed(seed)
    counts = np.random.default_rng(seed).integers(0, 100, CFG.vocab_size)
    d2t, t2d = build_vocab_map(counts, CFG.draft_vocab_size)
    model = Eagle3Drafter(replace(CFG, **flags), d2t, t2d)
    for p in model.parameters():  # away from the ones-init of the norms
        p.data.add_(0.1 * torch.randn_like(p))
    return model.double(), torch.nn.Embedding(CFG.vocab_size, CFG.hidden_size).double()


def reference_chain(model, embed, aux, ids, slot: int, steps: int) -> list[torch.Tensor]:
    """Drafts of one slot computed as vLLM's proposer does, one token at a time: step 0 over
    slots 0..slot (its keys are the context), then each chain step at position slot+k, attending
    to that context plus the chain's own earlier steps, fed the previous step's output (its
    normed form with norm_output), as vllm/model_executor/models/llama_eagle3.py computes it.
    No masks, no batching."""
    layer, attn = model.midlayer, model.midlayer.self_attn
    heads, kv_heads, dim = CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim

    cfg = model.cfg

    def run(token: int, hidden: torch.Tensor, position: int, keys: list, values: list):
        normed = layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(embed.weight[token]), normed])
        pos = torch.tensor([position])
        q = rotate(attn.q_proj(x).view(1, heads, 1, dim), pos, CFG.rope_theta)[0, :, 0]
        k = rotate(attn.k_proj(x).view(1, kv_heads, 1, dim), pos, CFG.rope_theta)[0, :, 0]
        v = attn.v_proj(x).view(kv_heads, dim)
        keys, values = [*keys, k], [*values, v]
        rep = heads // kv_heads
        K = torch.stack(keys).repeat_interleave(rep, 1)  # [n, heads, dim]
        V = torch.stack(values).repeat_interleave(rep, 1)
        weights = torch.softmax((K * q).sum(-1) / math.sqrt(dim), 0)  # [n, heads]
        out = (weights[..., None] * V).sum(0).reshape(-1)
        residual = (normed if cfg.norm_before_residual else hidden) + attn.o_proj(out)
        new_hidden = residual + layer.mlp(layer.post_attention_layernorm(residual))
        return new_hidden, k, v

    if cfg.norm_before_fc:
        aux = model.input_norm(aux)
    if cfg.fc_norm:  # vLLM: one RMSNorm per aux state, after input_norm
        size = cfg.target_hidden_size
        aux = torch.cat(
            [norm(aux[..., i * size : (i + 1) * size]) for i, norm in enumerate(model.fc_norm)], -1
        )
    fused = model.fc(aux)
    context_k, context_v = [], []
    for t in range(slot + 1):  # step 0: each slot attends to slots <= t
        hidden, k, v = run(int(ids[t + 1]), fused[t], t, context_k, context_v)
        context_k.append(k)
        context_v.append(v)
    logits = [model.lm_head(model.norm(hidden))]
    keys, values = list(context_k), list(context_v)
    for step in range(1, steps):
        fed = model.norm(hidden) if cfg.norm_output else hidden
        hidden, k, v = run(int(ids[slot + 1 + step]), fed, slot + step, keys, values)
        keys.append(k)
        values.append(v)
        logits.append(model.lm_head(model.norm(hidden)))
    return logits


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: "+".join(f) or "plain")
def test_training_time_test_equals_the_served_chain(flags: dict) -> None:
    model, embed = small_drafter(**flags)
    length, steps = 12, 4
    aux = torch.randn(1, length, 3 * CFG.hidden_size, dtype=torch.double)
    ids = torch.randint(0, CFG.vocab_size, (1, length))
    logits = [model.logits(out) for out in model(aux, ids, embed, steps)]
    for slot in (0, 3, length - 1 - steps):
        reference = reference_chain(model, embed, aux[0], ids[0], slot, steps)
        for step in range(steps):
            torch.testing.assert_close(logits[step][0, slot], reference[step])


def test_ttt_terms_mask_prompt_and_out_of_vocab_positions() -> None:
    length, vocab = 8, 5
    loss_mask = torch.tensor([[False, False, False, True, True, True, True, False]])
    teacher = torch.log_softmax(torch.randn(1, length, vocab), -1)
    in_draft = torch.ones(1, length, dtype=torch.bool)
    in_draft[0, 5] = False
    logits = [torch.randn(1, length, vocab) for _ in range(2)]
    kl, counts, correct = ttt_terms(logits, lambda x: x, teacher, in_draft, loss_mask)
    # step 0: slot t counts if tokens t+1, t+2 are assistant and teacher t+1 in vocab:
    # t=2 (3,4), t=3 (4,5), t=4 (teacher 5 out of vocab: no), t=5 (6, 7 not assistant: no)
    assert counts[0].item() == 2
    # step 1: tokens t+2, t+3 assistant, teacher t+2 in vocab: t=1 (3,4), t=2 (4,5); t=3 no
    assert counts[1].item() == 2
    assert all(k.item() >= 0 for k in kl)
    assert all(c <= n for c, n in zip(correct, counts, strict=True))
    # The KL is forward KL(teacher || draft) summed over the counted slots of step 0 (2, 3).
    reference = sum(
        F.kl_div(torch.log_softmax(logits[0][0, t], -1), teacher[0, t + 1], log_target=True,
                 reduction="sum")
        for t in (2, 3)
    )  # fmt: skip
    torch.testing.assert_close(kl[0], reference)
    _, _, skipped = ttt_terms(logits, lambda x: x, teacher, in_draft, loss_mask, accuracy=False)
    assert all(c == 0 for c in skipped)
    # With a hard-label weight w each slot adds w x the cross-entropy of the teacher's argmax.
    mixed, _, _ = ttt_terms(logits, lambda x: x, teacher, in_draft, loss_mask, True, 0.3)
    picked = sum(F.cross_entropy(logits[0][0, t], teacher[0, t + 1].argmax()) for t in (2, 3))
    torch.testing.assert_close(mixed[0], reference + 0.3 * picked)
    # A drafter whose slot t equals the teacher of position t+1+k: zero loss, full accuracy.
    perfect = [teacher.roll(-1 - step, dims=1) for step in range(2)]
    kl, counts, correct = ttt_terms(perfect, lambda x: x, teacher, in_draft, loss_mask)
    assert abs(kl[0].item()) < 1e-5 and correct[0] == counts[0]


def test_vocab_map_is_top_ids_ascending_with_offsets() -> None:
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 3])
    d2t, t2d = build_vocab_map(counts, 4)
    assert draft_to_target_ids(d2t).tolist() == [0, 2, 3, 5]
    assert d2t.dtype == torch.int64 and d2t.tolist() == [0, 1, 1, 2]
    assert t2d.tolist() == [True, False, True, True, False, True, False, False]
    assert coverage(counts, t2d) == pytest.approx(30 / 34)
    check_vocab_map(d2t, t2d, 8, "test")
    with pytest.raises(InputError, match="t2d has 8 entries but the target has 9"):
        check_vocab_map(d2t, t2d, 9, "vocab.reuse: old")
    with pytest.raises(InputError, match=r"vocab.draft_vocab_size: 9 is outside \[1, 8\]"):
        resolve_draft_vocab_size(9, 8)
    assert resolve_draft_vocab_size(None, 1600) == 800
    assert resolve_draft_vocab_size(None, 163840) == 32000


def test_global_batches_do_not_depend_on_process_count_and_resume_exactly() -> None:
    rng = np.random.default_rng(0)
    refs = [SampleRef(i % 3, i, int(n)) for i, n in enumerate(rng.integers(20, 200, 300))]
    one = list(TrainBatches(refs, batch_tokens=1000, seed=1, num_steps=80))
    rank0 = list(TrainBatches(refs, batch_tokens=1000, seed=1, num_steps=80, rank=0, world=2))
    rank1 = list(TrainBatches(refs, batch_tokens=1000, seed=1, num_steps=80, rank=1, world=2))
    assert [sorted(a + b) for a, b in zip(rank0, rank1, strict=True)] == [sorted(b) for b in one]
    resumed = list(TrainBatches(refs, batch_tokens=1000, seed=1, start_step=50, num_steps=80))
    assert resumed == one[50:]
    assert len(one) == 80  # runs on past the first epoch
    batches = epoch_batches(refs, seed=1, epoch=0, batch_tokens=1000)
    assert sorted(i for batch in batches for i in batch) == list(range(300))
    assert batches != epoch_batches(refs, seed=1, epoch=1, batch_tokens=1000)
    for batch in batches:  # padded size within the budget
        assert len(batch) == 1 or len(batch) * max(refs[i].num_tokens for i in batch) <= 1000


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_learning_rate_warms_up_then_decays_to_the_floor(schedule: str) -> None:
    def lr(i: int) -> float:
        return lr_at(i, peak=1.0, warmup=10, total=100, min_ratio=0.1, schedule=schedule)

    assert lr(0) == pytest.approx(0.1) and lr(9) == pytest.approx(1.0)
    assert lr(100) == pytest.approx(1.0 if schedule == "constant" else 0.1)
    assert all(lr(i) >= lr(i + 1) for i in range(10, 99))
    assert lr(55) == pytest.approx({"cosine": 0.55, "linear": 0.55, "constant": 1.0}[schedule])


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest() -> None:
    model, _ = small_drafter(norm_before_fc=True)
    model.lm_head.weight.requires_grad_(False)  # a frozen lm_head is in neither
    optimizer = build_optimizer(model.float(), name="muon", lr=0.01, weight_decay=0.0)
    muon, adamw = optimizer.optimizers
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in model.named_parameters() if p.ndim == 2} - {"lm_head.weight"}
    assert in_adamw == {n for n, p in model.named_parameters() if p.ndim == 1}
    assert "input_norm.weight" in in_adamw and "lm_head.weight" not in in_adamw | in_muon


@pytest.mark.parametrize("rule", ["match_rms_adamw", "original", None])
def test_float32_muon_steps_as_torchs_muon_does_with_a_float32_iteration(rule) -> None:
    """Where bf16 is emulated the drafter trains with Float32Muon: the same momentum, learning
    rate per shape, weight decay and Newton-Schulz iteration as torch's Muon, only in float32:
    the parameters end within bf16's rounding of torch's, not equal to them."""
    torch.manual_seed(0)
    shapes = [(48, 16), (16, 48), (32, 32)]
    start = [torch.randn(shape) for shape in shapes]
    grads = [[torch.randn(shape) for shape in shapes] for _ in range(3)]

    def run(optimizer_class):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = optimizer_class(params, lr=0.02, weight_decay=0.1, adjust_lr_fn=rule)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g
            opt.step()
        return params, opt

    ours, opt = run(Float32Muon)
    torchs, torch_opt = run(torch.optim.Muon)
    for a, b, s0 in zip(ours, torchs, start, strict=True):
        moved = (b - s0).norm()
        assert 0 < (a - b).norm() < 0.03 * moved
        assert torch.equal(opt.state[a]["momentum_buffer"], torch_opt.state[b]["momentum_buffer"])


def test_an_own_embedding_trains_under_adamw_ships_and_replaces_the_targets(
    tmp_path: Path,
) -> None:
    model, embed = small_drafter(own_embedding=True)
    model = model.float()
    muon, adamw = build_optimizer(model, name="muon", lr=0.01, weight_decay=0.0).optimizers
    assert any(p is model.embed_tokens.weight for g in adamw.param_groups for p in g["params"])
    assert all(p is not model.embed_tokens.weight for g in muon.param_groups for p in g["params"])
    export_vllm(model, [2, 4, 6], tmp_path / "vllm")
    weights = read_weights(tmp_path / "vllm/model.safetensors")
    assert weights["embed_tokens.weight"] == ((CFG.vocab_size, CFG.hidden_size), torch.bfloat16)
    loaded, _ = load_drafter(tmp_path / "vllm")
    assert loaded.cfg.own_embedding
    aux = torch.randn(1, 6, 3 * CFG.hidden_size)
    ids = torch.randint(0, CFG.vocab_size, (1, 6))
    other = torch.nn.Embedding(CFG.vocab_size, CFG.hidden_size)  # not the drafter's: unused
    for a, b in zip(loaded(aux, ids, embed.float(), 3), loaded(aux, ids, other, 3), strict=True):
        assert torch.equal(a, b)


def test_weight_average_is_the_moving_average_and_resumes_exactly() -> None:
    model, _ = small_drafter()
    model.lm_head.weight.requires_grad_(False)  # frozen weights are not averaged
    average = WeightAverage(model, decay=0.9)
    assert len(average.average) == sum(p.requires_grad for p in model.parameters())
    fc = next(i for i, p in enumerate(average.params) if p is model.fc.weight)
    expected = model.fc.weight.detach().clone()
    for i in range(1, 4):
        model.fc.weight.data.add_(torch.randn_like(expected))
        average.update()
        decay = min(0.9, (1 + i) / (10 + i))  # the first steps are forgotten faster
        expected = decay * expected + (1 - decay) * model.fc.weight.detach()
    torch.testing.assert_close(average.average[fc], expected)
    resumed = WeightAverage(model, decay=0.9)  # as after a checkpoint: its count matters too
    resumed.load_state_dict(average.state_dict())
    for _ in range(3):
        model.fc.weight.data.add_(torch.randn_like(expected))
        average.update()
        resumed.update()
    assert all(torch.equal(a, b) for a, b in zip(average.average, resumed.average, strict=True))
    average.copy_to_model()
    assert torch.equal(model.fc.weight, average.average[fc])


# What vLLM's Eagle3LlamaForCausalLM (vllm/model_executor/models/llama_eagle3.py, 0.32.0) and
# SGLang's LlamaForCausalLMEagle3 (python/sglang/srt/models/llama_eagle3.py) read: the config
# keys, and per weight name its shape as a function of the config (dtype bf16 unless noted).
EAGLE3_CONFIG_KEYS = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "num_hidden_layers": 1,
    "tie_word_embeddings": False,
}


def expected_weights(c: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    h, heads, kv, dim = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )
    inter, aux = c["intermediate_size"], len(c["eagle_aux_hidden_state_layer_ids"])
    bf16 = torch.bfloat16
    fc_input = aux * c["target_hidden_size"]
    return {
        **({"input_norm.weight": ((fc_input,), bf16)} if c["norm_before_fc"] else {}),
        **{
            f"fc_norm.{i}.weight": ((c["target_hidden_size"],), bf16)
            for i in range(aux if c["fc_norm"] else 0)
        },
        "fc.weight": ((h, fc_input), bf16),
        "midlayer.input_layernorm.weight": ((h,), bf16),
        "midlayer.hidden_norm.weight": ((h,), bf16),
        "midlayer.post_attention_layernorm.weight": ((h,), bf16),
        "midlayer.self_attn.q_proj.weight": ((heads * dim, 2 * h), bf16),
        "midlayer.self_attn.k_proj.weight": ((kv * dim, 2 * h), bf16),
        "midlayer.self_attn.v_proj.weight": ((kv * dim, 2 * h), bf16),
        "midlayer.self_attn.o_proj.weight": ((h, heads * dim), bf16),
        "midlayer.mlp.gate_proj.weight": ((inter, h), bf16),
        "midlayer.mlp.up_proj.weight": ((inter, h), bf16),
        "midlayer.mlp.down_proj.weight": ((h, inter), bf16),
        "norm.weight": ((h,), bf16),
        "lm_head.weight": ((c["draft_vocab_size"], h), bf16),
        "d2t": ((c["draft_vocab_size"],), torch.int64),
        "t2d": ((c["vocab_size"],), torch.bool),
    }


def read_weights(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    with safe_open(str(path), "pt") as f:
        return {k: (tuple(f.get_tensor(k).shape), f.get_tensor(k).dtype) for k in f.keys()}


@pytest.mark.parametrize(
    "flags", [FLAG_SETS[0], FLAG_SETS[-2], FLAG_SETS[-1]], ids=["plain", "all-flags", "fc-norm"]
)
def test_exports_conform_to_vllm_sglang_and_speculators_loaders(
    tmp_path: Path, flags: dict
) -> None:
    model, embed = small_drafter(**flags)
    model = model.float()
    aux_ids = [2, 4, 6]
    export_vllm(model, aux_ids, tmp_path / "vllm")
    config = json.loads((tmp_path / "vllm/config.json").read_text())
    for key, value in EAGLE3_CONFIG_KEYS.items():
        assert config[key] == value, key
    for name in RECIPE_FLAGS:  # every flag written: vLLM's default is not always ours
        assert config[name] is flags.get(name, False), name
    assert config["eagle_aux_hidden_state_layer_ids"] == aux_ids  # vLLM: our ids
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]  # SGLang: -1
    assert config["draft_vocab_size"] == CFG.draft_vocab_size
    assert config["vocab_size"] == CFG.vocab_size  # the target's rows, not the draft's
    assert config["target_hidden_size"] == CFG.target_hidden_size
    weights = read_weights(tmp_path / "vllm/model.safetensors")
    assert weights == expected_weights(config)  # no embed_tokens, no `model.` prefix

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    export_speculators(model, aux_ids, tmp_path / "spec", target=target, num_speculative_tokens=3)
    spec = json.loads((tmp_path / "spec/config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3"
    for name in RECIPE_FLAGS:  # absent norm_before_residual reads as True
        assert spec[name] is flags.get(name, False), name
    assert spec["eagle_aux_hidden_state_layer_ids"] == aux_ids
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    layer = spec["transformer_layer_config"]
    expected = {
        name.replace("midlayer.", "layers.0."): shape
        for name, shape in expected_weights(layer | spec).items()
    }
    assert read_weights(tmp_path / "spec/model.safetensors") == expected

    # The offline evaluation reads the export back: same flags, same chain (bf16 weights).
    loaded, _ = load_drafter(tmp_path / "vllm")
    assert loaded.cfg == replace(CFG, **flags)
    aux = torch.randn(1, 6, 3 * CFG.hidden_size)
    ids = torch.randint(0, CFG.vocab_size, (1, 6))
    embed = embed.float()
    rounded = type(model)(model.cfg, model.d2t, model.t2d)
    rounded.load_state_dict({k: v.bfloat16().float() for k, v in model.state_dict().items()})
    for ours, theirs in zip(rounded(aux, ids, embed, 3), loaded(aux, ids, embed, 3), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_vocab_reuse_keeps_the_map_of_an_earlier_export(tmp_path: Path) -> None:
    from eagleflow.vocab import build_vocab, write_counts

    model, _ = small_drafter()
    export_vllm(model.float(), [2, 4, 6], tmp_path / "old")
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"vocab_size": CFG.vocab_size}))
    counts = np.zeros(CFG.vocab_size, dtype=np.int64)
    counts[:5] = 100  # new data favours other ids than the old map holds
    write_counts(tmp_path / "c.npz", {"train": counts, "heldout": counts})
    report = build_vocab(
        [tmp_path / "c.npz"], target, tmp_path / "v.safetensors", tmp_path / "r.json",
        draft_vocab_size=None, reuse=tmp_path / "old",
    )  # fmt: skip
    reused = load_file(str(tmp_path / "v.safetensors"))
    assert torch.equal(reused["d2t"], model.d2t) and torch.equal(reused["t2d"], model.t2d)
    assert report["reused_from"] == str(tmp_path / "old")
    (target / "config.json").write_text(json.dumps({"vocab_size": CFG.vocab_size + 1}))
    with pytest.raises(InputError, match="t2d has 50 entries but the target has 51"):
        build_vocab(
            [tmp_path / "c.npz"], target, tmp_path / "w.safetensors", tmp_path / "s.json",
            draft_vocab_size=None, reuse=tmp_path / "old",
        )  # fmt: skip
    assert not (tmp_path / "w.safetensors").exists()
