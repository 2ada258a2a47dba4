"""The target's chat template: the one place prompts become token ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def render_prompt_ids(
    tokenizer: Any,
    messages: list[dict],
    template_kwargs: Mapping[str, Any] | None = None,
    tools: list | None = None,
) -> list[int]:
    """Prompt ids from the target tokenizer's own chat template, with the generation prompt.

    `template_kwargs` are the template's own variables (Kimi-K2.5's `thinking`, Qwen3's
    `enable_thinking`), `tools` the request's tool definitions. Rendered to text and then
    encoded without extra special tokens, as vLLM's chat path does, so ids match what the
    serving engine sees for the same conversation. Every later stage (generation, prepare, the
    serving check, one pass) uses these ids: the template is rendered here only.
    """
    text = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=True,
        tokenize=False,
        **dict(template_kwargs or {}),
    )
    return tokenizer.encode(text, add_special_tokens=False)
