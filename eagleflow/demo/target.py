"""Build the demo target: tokenizer, Llama model and training, all offline and deterministic.

The same arguments on the same machine give a bit-identical directory: every random draw is
seeded, the thread count is fixed, torch runs deterministic algorithms and the training length
is a fixed number of steps, never a time budget.
"""

import math
import os
import random
import sys
import time
from pathlib import Path

# Set before torch loads its OpenMP runtime. With the default spinning wait, the two training
# threads slow down ~20x whenever another busy process shares the two cores; sleeping waiters
# cost little when the cores are free.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from eagleflow.demo.corpus import training_conversations
from eagleflow.files import atomic_output
from eagleflow.precision import native_bf16

BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
THINK_TOKENS = ("<think>", "</think>")

# Each turn is `<|role|>\n{content}<|end|>\n`; the assistant content keeps its <think> block.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# Embedding rows are padded to a multiple of this, as in real models, so config.vocab_size
# exceeds the tokenizer length: the draft vocab, t2d and vLLM must size by the former.
VOCAB_MULTIPLE = 64
IGNORE_INDEX = -100
WIDTH_MULTIPLE = 16


def _render(tokenizer: PreTrainedTokenizerFast, messages: list[dict], prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def train_tokenizer(conversations: list[list[dict]], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with the chat special tokens and `<think>`, `</think>`."""
    bpe = Tokenizer(models.BPE())
    # Numbers split into chunks of at most two digits (a leading space may join the first): a
    # chunk of 1-99 is one token, so copying a number from the prompt is a short, unambiguous
    # token copy, and single digits in the column-by-column traces stay single tokens.
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?\d{1,2}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(
        (message["content"] for conversation in conversations for message in conversation),
        trainer,
    )
    # Not special: decoding with skip_special_tokens (vLLM's default) must keep the think block.
    bpe.add_tokens([AddedToken(token, special=False, normalized=False) for token in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )


def encode_conversations(
    tokenizer: PreTrainedTokenizerFast, conversations: list[list[dict]]
) -> list[tuple[list[int], int]]:
    """(token ids up to and including the final `<|end|>`, prompt length) per conversation."""
    prompts = [_render(tokenizer, conversation[:-1], prompt=True) for conversation in conversations]
    fulls = [_render(tokenizer, conversation, prompt=False) for conversation in conversations]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(fulls, add_special_tokens=False)["input_ids"]
    encoded = []
    for prompt, full in zip(prompt_ids, full_ids, strict=True):
        if full[: len(prompt)] != prompt:
            raise ValueError("the prompt does not tokenize to a prefix of the conversation")
        # Drop the newline the template puts after the last <|end|>: it is never generated.
        end = len(full) - 1 - full[::-1].index(tokenizer.eos_token_id)
        encoded.append((full[: end + 1], len(prompt)))
    return encoded


def _length_bucketed_batches(
    encoded: list[tuple[list[int], int]], batch_size: int, rng: random.Random
) -> list[list[int]]:
    """Shuffled batches of similar-length samples, so little compute goes to padding."""
    order = list(range(len(encoded)))
    rng.shuffle(order)
    pool_size = batch_size * 32
    batches = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: len(encoded[i][0]))
        batches += [
            pool[i : i + batch_size] for i in range(0, len(pool) - batch_size + 1, batch_size)
        ]
    rng.shuffle(batches)
    return batches


def _collate(
    encoded: list[tuple[list[int], int]], batch: list[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Few distinct widths: each new shape costs oneDNN a kernel build and cache memory.
    longest = max(len(encoded[i][0]) for i in batch)
    width = -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for row, index in enumerate(batch):
        ids, prompt_length = encoded[index]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        # Loss only on the assistant turn (its <think> block, answer and <|end|>).
        labels[row, prompt_length : len(ids)] = input_ids[row, prompt_length : len(ids)]
    return input_ids, attention_mask, labels


def _learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _model_config(
    tokenizer: PreTrainedTokenizerFast,
    num_layers: int,
    hidden_size: int,
    head_dim: int,
    num_kv_heads: int,
    max_position_embeddings: int,
) -> LlamaConfig:
    vocab_size = math.ceil(len(tokenizer) / VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 11 // 4 // 64 * 64,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // head_dim,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"],
    )


def _train(
    model: LlamaForCausalLM,
    encoded: list[tuple[list[int], int]],
    *,
    pad_id: int,
    seed: int,
    train_steps: int,
    batch_size: int,
    learning_rate: float,
) -> list[float]:
    rng = random.Random(f"demo-batches-{seed}")
    # fused: one kernel for all parameters instead of a dozen small ops per tensor.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, weight_decay=0.01, betas=(0.9, 0.95), fused=True
    )
    warmup = max(1, train_steps // 20)
    batches: list[list[int]] = []
    losses = []
    model.train()
    progress = tqdm(range(train_steps), desc="demo target", file=sys.stderr, unit="step")
    started = time.perf_counter()
    tokens_seen = 0
    for step in progress:
        if not batches:
            batches = _length_bucketed_batches(encoded, batch_size, rng)
        input_ids, attention_mask, labels = _collate(encoded, batches.pop(), pad_id)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, train_steps, learning_rate, warmup)
        # bf16 matmuls (AMX / AVX512-BF16) roughly double CPU throughput; weights stay fp32.
        # Without them bf16 is emulated, ~10x slower than float32 (see eagleflow.precision).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16("cpu")):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tokens_seen += int(attention_mask.sum())
        rate = tokens_seen / (time.perf_counter() - started)
        progress.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:.0f}", refresh=False)
    return losses


def build_demo_target(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_layers: int = 8,
    hidden_size: int = 128,
    head_dim: int = 64,
    num_kv_heads: int = 1,
    tokenizer_vocab_size: int = 1536,
    num_conversations: int = 20000,
    train_steps: int = 1100,
    batch_size: int = 16,
    learning_rate: float = 6e-3,
    num_threads: int = 2,
) -> dict:
    """Train and save the demo target under `out_dir`; return a summary of the build.

    The defaults take about 2.5 minutes on two CPU cores. Narrow and deep on purpose: 8 layers
    keep the aux layer ids (2, N//2, N-3) distinct, and width 128 trains ~2x faster than 256,
    which buys the steps the model needs to learn to copy numbers from the prompt. head_dim 64
    is a head size vLLM's CPU attention supports; GQA (fewer KV heads) matches real models.
    """
    out_dir = Path(out_dir)
    started = time.perf_counter()
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(num_threads)
    torch.use_deterministic_algorithms(True)
    # Tiny gradients and Adam moments become denormal floats late in training, and CPUs handle
    # those ~100x slower: flushing them to zero made the build 25% faster, same weights to the bit.
    torch.set_flush_denormal(True)
    try:
        conversations = training_conversations(seed, num_conversations)
        tokenizer = train_tokenizer(conversations, tokenizer_vocab_size)
        encoded = encode_conversations(tokenizer, conversations)
        config = _model_config(
            tokenizer,
            num_layers,
            hidden_size,
            head_dim,
            num_kv_heads,
            max_position_embeddings=tokenizer.model_max_length,
        )
        torch.manual_seed(seed)
        # Eager attention trains faster than SDPA under bf16 autocast on CPU at this size.
        model = LlamaForCausalLM._from_config(config, attn_implementation="eager")
        losses = _train(
            model,
            encoded,
            pad_id=tokenizer.pad_token_id,
            seed=seed,
            train_steps=train_steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
        )

        model.config.dtype = torch.bfloat16
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
        )
        with atomic_output(out_dir) as staging:
            model.to(torch.bfloat16).save_pretrained(staging)
            tokenizer.save_pretrained(staging)
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_deterministic)
        torch.set_flush_denormal(False)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "steps": train_steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "seconds": round(time.perf_counter() - started, 1),
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tokenizer),
    }
