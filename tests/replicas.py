"""Tiny offline replicas of target checkpoints whose layout the workflow must handle.

`write_kimi_tokenizer` replicates the tokenizer layout of Kimi-K2 / Kimi-K2.5: no
`tokenizer.json`, but a tiktoken vocabulary (`tiktoken.model`, lines `<base64 bytes> <rank>`),
the tokenizer class the checkpoint ships (`tokenization_kimi.py`: a `PreTrainedTokenizer` over
`tiktoken.Encoding`, with 256 reserved special ids after the ranks) and a `tokenizer_config.json`
that registers that class through `auto_map`, so transformers loads it only with
`trust_remote_code=True`. Its chat template follows Kimi-K2.5's: `<|im_system|>`, `<|im_user|>`,
`<|im_assistant|>` turns split by `<|im_middle|>` and closed by `<|im_end|>`, a default system
prompt, `<think>` blocks on assistant turns and a generation prompt
`<|im_assistant|>assistant<|im_middle|><think>` (`<think></think>` with `thinking=False`).

The vocabulary is a byte-level BPE learned from a fixed text in this file (English, some
Chinese and code identifiers, so that Kimi's split regex gives other ids than a generic one):
the 256 single bytes plus a few hundred merges, the same on every run, built in milliseconds.
A model sized with `kimi_vocab_size` may have more embedding rows than that. Tests use
it to check that the workflow copes with a tokenizer that is code rather than a file, without
downloading Kimi's 160k-token vocabulary or its 1T-parameter weights.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

NUM_RESERVED_SPECIAL_TOKENS = 256  # ids after the ranks, as Kimi's tokenizer class reserves
MAX_MERGES = 400

# Special tokens by offset from the first id after the ranks (Kimi-K2's offsets: [BOS] at
# 163584 = ranks + 0, <|im_middle|> at + 17, [UNK] and [PAD] at the end of the reserved block).
SPECIAL_TOKEN_OFFSETS = {
    "[BOS]": 0,
    "[EOS]": 1,
    "<|im_end|>": 2,
    "<|im_user|>": 3,
    "<|im_assistant|>": 4,
    "<|start_header_id|>": 6,
    "<|end_header_id|>": 7,
    "[EOT]": 9,
    "<|im_system|>": 10,
    "<|im_middle|>": 17,
    "<|media_begin|>": 18,
    "<|media_content|>": 19,
    "<|media_end|>": 20,
    "<|media_pad|>": 21,
    "<think>": 22,
    "</think>": 23,
    "[UNK]": 254,
    "[PAD]": 255,
}
# Markers the model may write in its answer: added tokens, but not "special" (kept by
# `decode(..., skip_special_tokens=True)`), as in Kimi-K2-Thinking.
NOT_SPECIAL = ("<think>", "</think>")
ADDITIONAL_SPECIAL_TOKENS = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
]
DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

# The text the merges are learned from: fixed, so the vocabulary is the same on every run.
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A speculative decoder drafts a few tokens with a
small model, and the large target model checks them all in one forward pass. When the draft is
right, the target accepts several tokens at the cost of one step; when it is wrong, the target
keeps the tokens up to the first mistake and adds one of its own. The answer is always the same
as the target would have written alone, only faster.

EAGLE drafters read the hidden states of the target from a few of its layers and predict the
next token from them. To train one, we first let the target answer many prompts, then we record
the hidden states of every answer, and finally we fit the drafter to predict each next token of
the answer from the states before it. The training data is large: for every token of every
answer, three layers of hidden states, each several thousand numbers wide.

Hello, world! How are you today? I am fine, thank you. What is the capital of France? The
capital of France is Paris. Please write a short poem about the sea. The sea is wide and deep,
the waves are slow and the wind is cold. Tell me a story about a cat who lived in a library and
read every book on the shelves at night, when the people had gone home.

You are a helpful assistant. The user asks a question and the assistant answers it. Think step
by step before you answer. First, read the question carefully. Second, write down what you
know. Third, work out the answer and check it. Finally, give the answer in one short sentence.

Every morning the baker opens the shop, lights the oven and bakes bread for the town. The
children stop at the window on their way to school, and the smell of fresh bread follows them
down the street. In the evening the baker counts the coins, cleans the tables and goes home to
read. Some days are busy and some are quiet, but the bread is always ready before the sun rises.

A good prompt says what the answer should contain, how long it should be and who will read it.
Short prompts get short answers; long conversations with many turns get longer ones. The model
reads the whole conversation, including the system message, before it writes a single token of
its answer, and it stops when it writes the end of turn token.

The train leaves the station at nine and reaches the mountains before noon. From the window
the passengers watch the rivers, the forests and the small villages pass by. At the last stop
they walk to the lake, where the water is clear and cold, and they eat their lunch on the rocks
while the clouds move slowly over the mountains and the light changes on the water.

Kimi speaks Chinese too: 你好，世界。你好，我是一个助手。今天天气很好，
我们去公园散步吧。中文文本也会出现在对话里，中文的句子和英文的句子一样重要。
Mixed text: the word 中文 means Chinese, 中国 means China, 世界 means world, 你好 means hello,
and 中间 means middle; say 你好 to the 世界 in 中文.

Numbers: 1, 2, 3, 10, 20, 100, 1000, 2024, 3.14, 42. Classes: TikTokenTokenizer, AutoTokenizer,
PreTrainedTokenizer, TokenizerConfig, TokenizerTest, AutoConfig, AutoModel, TokenCounter. Code:
def main(): return 0 if x == 1 else print("hello") for i in range(10): pass. JSON: {"role":
"user", "content": "hello"}.
"""

# The tokenizer class the checkpoint ships (written here in the spirit of Kimi's
# tokenization_kimi.py, with the same imports, constructor and encode/decode paths).
TOKENIZATION_KIMI = '''\
"""Tiktoken tokenizer of a Kimi-like checkpoint (a test replica of Kimi's tokenization_kimi.py)."""

import os
from pathlib import Path
from shutil import copyfile
from typing import Any, Optional, Union

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.tokenization_utils import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}


class TikTokenTokenizer(PreTrainedTokenizer):
    """Byte-level BPE from `tiktoken.model`, then `num_reserved_special_tokens` special ids
    named by `added_tokens_decoder` (the rest `<|reserved_token_{id}|>`)."""

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]
    num_reserved_special_tokens = 256
    pat_str = "|".join(
        [
            r"""[\\p{Han}]+""",
            r"""[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"""
            r"""[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"""
            r"""[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\\p{N}{1,3}""",
            r""" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*""",
            r"""\\s*[\\r\\n]+""",
            r"""\\s+(?!\\S)""",
            r"""\\s+""",
        ]
    )

    def __init__(
        self,
        vocab_file,
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token=None,
        pad_token=None,
        additional_special_tokens=None,
        added_tokens_decoder: Optional[dict] = None,
        **kwargs,
    ):
        assert os.path.isfile(vocab_file), vocab_file
        if additional_special_tokens is None:
            additional_special_tokens = ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                         "<|im_system|>", "<|im_middle|>"]
        names = {int(i): str(token) for i, token in (added_tokens_decoder or {}).items()}
        self.vocab_file = vocab_file
        mergeable_ranks = load_tiktoken_bpe(vocab_file)
        num_base_tokens = len(mergeable_ranks)
        self.special_tokens = {
            names.get(i, f"<|reserved_token_{i}|>"): i
            for i in range(num_base_tokens, num_base_tokens + self.num_reserved_special_tokens)
        }
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name,
            pat_str=self.pat_str,
            mergeable_ranks=mergeable_ranks,
            special_tokens=self.special_tokens,
        )
        self.n_words: int = self.model.n_vocab
        self.bos_id: int = self.special_tokens[str(bos_token)]
        self.eos_id: int = self.special_tokens[str(eos_token)]
        self.unk_id = self.special_tokens.get(str(unk_token))
        self.pad_id = self.special_tokens.get(str(pad_token))

        # Tokens as strings: each byte shown as a printable character, as GPT-2's BPE does.
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.decoder = {
            i: "".join(self.byte_encoder[b] for b in self.model.decode_single_token_bytes(i))
            for i in range(self.n_words)
        }
        self.encoder = {token: i for i, token in self.decoder.items()}

        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            additional_special_tokens=additional_special_tokens,
            added_tokens_decoder=added_tokens_decoder,
            **kwargs,
        )

    def encode(self, text: str, allow_special_tokens: bool = True, **kwargs) -> list[int]:
        """Token ids of `text`; special tokens written in it stay single ids. With any other
        argument, the generic path of PreTrainedTokenizer (which ends in `_tokenize`)."""
        if kwargs:
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

    def decode(self, token_ids: Union[int, list[int]], **kwargs) -> str:
        if kwargs:
            return super().decode(token_ids, **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.model.decode(list(token_ids))

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index)

    @staticmethod
    def clean_up_tokenization(out_string: str) -> str:
        return out_string

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray(self.byte_decoder[c] for c in "".join(tokens))
        return data.decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None):
        if not os.path.isdir(save_directory):
            raise ValueError(f"vocabulary path ({save_directory}) should be a directory")
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        out_vocab_file = os.path.join(save_directory, name)
        if os.path.abspath(self.vocab_file) != os.path.abspath(out_vocab_file):
            copyfile(self.vocab_file, out_vocab_file)
        return (out_vocab_file,)

    def apply_chat_template(self, conversation, tools=None, **kwargs: Any):
        return super().apply_chat_template(conversation, tools=tools, **kwargs)
'''

# Kimi-K2.5-like: default system prompt, `<think></think>` on assistant turns before the last
# user turn, `<think>{reasoning_content}</think>` after it, `<think>` opening the generation.
CHAT_TEMPLATE = (
    """\
{%- macro render_content(msg) -%}
{%- if msg.content is string -%}{{- msg.content -}}
{%- elif msg.content -%}
{%- for part in msg.content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}\
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}\
{%- endif -%}{%- endfor -%}
{%- if messages[0].role != 'system' -%}
<|im_system|>system<|im_middle|>"""
    + DEFAULT_SYSTEM_PROMPT
    + """<|im_end|>
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}<|im_system|>{{ m.name or 'system' }}<|im_middle|>
{%- elif m.role == 'user' -%}<|im_user|>{{ m.name or 'user' }}<|im_middle|>
{%- elif m.role == 'assistant' -%}<|im_assistant|>{{ m.name or 'assistant' }}<|im_middle|>
{%- if loop.index0 > ns.last_user -%}<think>{{ m.reasoning_content or '' }}</think>
{%- else -%}<think></think>
{%- endif -%}
{%- else -%}<|im_system|>{{ m.name or m.role }}<|im_middle|>
{%- endif -%}
{{- render_content(m) -}}<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>
{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>\
{%- endif -%}
{%- endif -%}
"""
)

_PRETOKENIZE = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+")


def learn_merges(text: str = TRAINING_TEXT, max_merges: int = MAX_MERGES) -> list[bytes]:
    """Multi-byte tokens of a byte-level BPE learned from `text`, in merge order.

    Words (pre-split like GPT-2's, a leading space kept) are merged pair by pair, the most
    frequent pair first (ties: the smaller bytes), while a pair occurs at least twice.
    """
    words = Counter(
        tuple(bytes([b]) for b in piece.encode()) for piece in _PRETOKENIZE.findall(text)
    )
    merges: list[bytes] = []
    known = {bytes([b]) for b in range(256)}
    while len(merges) < max_merges:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        pair, count = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        if count < 2:
            break
        merged = pair[0] + pair[1]
        if merged not in known:
            known.add(merged)
            merges.append(merged)
        merged_words: Counter[tuple[bytes, ...]] = Counter()
        for word, n in words.items():
            merged_words[_merge(word, pair, merged)] += n
        words = merged_words
    return merges


def _merge(word: tuple[bytes, ...], pair: tuple[bytes, bytes], merged: bytes) -> tuple:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def kimi_ranks() -> dict[bytes, int]:
    """The replica's tiktoken ranks: the 256 bytes in order, then the learned merges."""
    tokens = [bytes([b]) for b in range(256)] + learn_merges()
    return {token: rank for rank, token in enumerate(tokens)}


def kimi_vocab_size(path: str | Path) -> int:
    """Entries of the replica tokenizer in `path` (= `len(tokenizer)`): its ranks plus the
    reserved special ids. A model sized to it may have more embedding rows (Kimi pads)."""
    lines = (Path(path) / "tiktoken.model").read_text().splitlines()
    return sum(1 for line in lines if line.strip()) + NUM_RESERVED_SPECIAL_TOKENS


def kimi_special_token_ids(path: str | Path) -> dict[str, int]:
    """The named special tokens of the replica in `path` and their ids."""
    base = kimi_vocab_size(path) - NUM_RESERVED_SPECIAL_TOKENS
    return {token: base + offset for token, offset in SPECIAL_TOKEN_OFFSETS.items()}


def write_kimi_tokenizer(path: str | Path) -> Path:
    """Write a Kimi-K2.5-like tokenizer into directory `path` (created): `tiktoken.model`,
    `tokenization_kimi.py`, `tokenizer_config.json` (with `auto_map` and the chat template)
    and `special_tokens_map.json`. Returns `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ranks = kimi_ranks()
    (path / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items())
    )
    (path / "tokenization_kimi.py").write_text(TOKENIZATION_KIMI)
    base = len(ranks)
    added_tokens_decoder = {
        str(base + offset): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token not in NOT_SPECIAL,
        }
        for token, offset in SPECIAL_TOKEN_OFFSETS.items()
    }
    config = {
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": ADDITIONAL_SPECIAL_TOKENS,
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {
        "additional_special_tokens": ADDITIONAL_SPECIAL_TOKENS,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
    }
    (path / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return path


CONFIGURATION_DEEPSEEK = '''\
"""Kimi-K2's config class (a test replica: transformers' DeepSeek-V3 config under Kimi's
model type, which transformers does not know, so config.json needs this file and trust)."""

from transformers import DeepseekV3Config as _DeepseekV3Config


class DeepseekV3Config(_DeepseekV3Config):
    model_type = "kimi_k2"
'''


def tiny_deepseek_v3(path: str | Path, *, extra_rows: int = 64) -> dict:
    """The tiny DeepSeek-V3 decoder config (Kimi-K2's architecture) of `family_config` as a
    dict, its vocabulary `extra_rows` larger than the replica tokenizer in `path` (Kimi pads
    its embedding too)."""
    special = kimi_special_token_ids(path)
    tokens = {"bos_token_id": special["[BOS]"], "eos_token_id": special["<|im_end|>"],
              "pad_token_id": special["[PAD]"]}  # fmt: skip
    return family_config("deepseek_v3", kimi_vocab_size(path) + extra_rows, tokens).to_dict()


# Kimi-K2.5's released image preprocessing settings (its `preprocessor_config.json`).
KIMI_K25_PREPROCESSOR = {"media_proc_cfg": {
    "in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "merge_kernel_size": 2, "fixed_output_tokens": None,
    "patch_limit_on_one_side": 512, "in_patch_limit_each_frame": 4096,
    "in_patch_limit_video": None, "sample_fps": 2.0, "max_num_frames_each_video": None,
    "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff", "config_type": "image",
}}  # fmt: skip


def write_kimi_config(path: str | Path, *, layout: str = "k2", extra_rows: int = 64) -> Path:
    """Write the `config.json` of a tiny Kimi target into `path` (which holds the replica
    tokenizer; no weights), laid out as

    - `k2`: Kimi-K2's: a DeepSeek-V3 decoder under `model_type: kimi_k2`, registered through
      `auto_map` with the `configuration_deepseek.py` written beside it, so that, like the
      tokenizer, it loads only with `trust_remote_code=True`;
    - `k25`: Kimi-K2.5's multimodal wrapper, `model_type: kimi_k25` with the decoder under
      `text_config` (its `model_type: kimi_k2`), `image_token_id` the tokenizer's
      `<|media_pad|>`, and the checkpoint's `preprocessor_config.json` (vLLM builds the image
      processor from it even for text). transformers 5 knows this type natively (the real
      checkpoint's `auto_map` to its own config and processor code is left out).
    """
    path = Path(path)
    decoder = tiny_deepseek_v3(path, extra_rows=extra_rows)
    if layout == "k2":
        config = {
            **decoder,
            "model_type": "kimi_k2",
            "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        }
        (path / "configuration_deepseek.py").write_text(CONFIGURATION_DEEPSEEK)
    elif layout == "k25":
        config = {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "text_config": {**decoder, "model_type": "kimi_k2"},
            "vision_config": {"hidden_size": 32, "num_hidden_layers": 1,
                              "num_attention_heads": 2, "intermediate_size": 64},
            "projection_hidden_size": 32,  # = the vision width, as in the release (1152 both)
            "tie_word_embeddings": False,
            "image_token_id": kimi_special_token_ids(path)["<|media_pad|>"],
        }  # fmt: skip
        (path / "preprocessor_config.json").write_text(json.dumps(KIMI_K25_PREPROCESSOR) + "\n")
    else:
        raise ValueError(f"layout must be 'k2' or 'k25', not {layout!r}")
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def write_kimi_target(path: str | Path, *, layout: str = "k2") -> Path:
    """A Kimi-like target directory without weights (enough to plan prompts): the replica
    tokenizer and a tiny config (`write_kimi_config`)."""
    return write_kimi_config(write_kimi_tokenizer(path), layout=layout)


# transformers 5.19 saves Kimi-K2.5 under names of its own in three places (its save-time
# renaming also hits the decoder's layers); the released checkpoint, which transformers and
# vLLM both load, names them like this.
RELEASED_KIMI_K25_NAMES = (
    (re.compile(r"^language_model\.model\.blocks\."), "language_model.model.layers."),
    (re.compile(r"^vision_tower\.encoder\.patch_embed\."), "vision_tower.patch_embed."),
    (re.compile(r"^model\.mm_projector\."), "mm_projector."),
)


def write_kimi_k25_weights(path: str | Path, *, seed: int = 0) -> Path:
    """Random bf16 weights for the `k25` replica in `path`, made by transformers' own
    Kimi-K2.5 class and stored in the released checkpoint's layout: the DeepSeek-V3 decoder
    under `language_model.model.layers.*`, its lm_head under `language_model.lm_head.*`, next
    to the vision tower and projector (`vision_tower.*`, `mm_projector.*`) that the text stages
    leave alone."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForImageTextToText

    path = Path(path)
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForImageTextToText.from_config(config).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        saved = load_file(Path(tmp) / "model.safetensors")
    released = {}
    for name, tensor in saved.items():
        for pattern, replacement in RELEASED_KIMI_K25_NAMES:
            name = pattern.sub(replacement, name)
        released[name] = tensor
    save_file(released, path / "model.safetensors", metadata={"format": "pt"})
    return path


# --- Decoder families: tiny random-weight targets from transformers' own config classes -------

# 8 layers: the default aux ids (2, N//2, N-3) need N >= 8. Head size 32: the smallest vLLM's
# CPU attention supports.
FAMILY_DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                  "max_position_embeddings": 2048}  # fmt: skip
FAMILIES = ("llama3", "qwen3", "qwen3_moe", "deepseek_v3")


def family_config(family: str, vocab_size: int, special: dict[str, int]):
    """A tiny config of `family` built by transformers' own class, with the shape features that
    matter to the workflow: Llama-3's llama3 rope scaling and GQA; Qwen3's tied embeddings and
    q/k norms; Qwen3-MoE's routed experts; DeepSeek-V3's MLA, noaux_tc routing with a first
    dense layer (Kimi-K2's decoder)."""
    from transformers import DeepseekV3Config, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    tokens = {"vocab_size": vocab_size, **special}
    if family == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024}  # fmt: skip
        config = LlamaConfig(**FAMILY_DECODER, **tokens, rope_parameters=rope)
        config.architectures = ["LlamaForCausalLM"]
    elif family == "qwen3":
        config = Qwen3Config(**FAMILY_DECODER, **tokens, tie_word_embeddings=True)
        config.architectures = ["Qwen3ForCausalLM"]
    elif family == "qwen3_moe":
        config = Qwen3MoeConfig(**FAMILY_DECODER, **tokens, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=32, decoder_sparse_step=1)  # fmt: skip
        config.architectures = ["Qwen3MoeForCausalLM"]
    elif family == "deepseek_v3":
        decoder = {k: v for k, v in FAMILY_DECODER.items() if k not in ("head_dim",)}
        # The latent width is DeepSeek-V3's own (512 + 64 rope): vLLM's CPU MLA kernel knows
        # no other.
        config = DeepseekV3Config(
            **{**decoder, "num_key_value_heads": 2}, **tokens, moe_intermediate_size=32,
            n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=32,
            qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
        )  # fmt: skip
        # Released DeepSeek-V3 / Kimi-K2 configs name their routing; vLLM reads these keys
        # (transformers' class implies them), without them it expects no correction bias.
        config.topk_method, config.scoring_func = "noaux_tc", "sigmoid"
        config.architectures = ["DeepseekV3ForCausalLM"]
    else:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")
    return config


def write_family_target(path: str | Path, family: str, *, seed: int = 0) -> Path:
    """A tiny random-weight `family` target in `path`: the demo's byte-level BPE tokenizer and
    chat template (trained on a few demo conversations, deterministic) and bf16 weights, its
    embedding padded to a multiple of 64 rows beyond the tokenizer's entries, as real
    checkpoints pad theirs."""
    import torch
    from transformers import AutoModelForCausalLM

    from eagleflow.demo.corpus import training_conversations
    from eagleflow.demo.target import train_tokenizer

    path = Path(path)
    tokenizer = train_tokenizer(training_conversations(seed, 400), vocab_size=600)
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    rows = (len(tokenizer) // 64 + 1) * 64
    config = family_config(family, rows, special)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
