"""The target's chat template: the one place prompts become token ids."""

from __future__ import annotations


def render_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt ids from the target tokenizer's own chat template, with the generation prompt.

    Rendered to text and then encoded without extra special tokens, as vLLM's chat path does,
    so ids match what the serving engine sees for the same conversation.
    """
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)
