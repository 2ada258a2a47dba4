"""Seeded synthetic corpus of short reasoning conversations for the demo target.

Four families (integer arithmetic, sorting, unit conversion, string edits), each with several
user phrasings, trace wordings and answer sentences, so a model trained on it does not answer
with one fixed template. Every answer is computed, hence correct.

The user phrasing picks the wording of the whole answer (see `problem.pick`), so a greedy model can
tell from the prompt which wording to use and its answers vary from prompt to prompt.

Held-out split: a user text is *held out* when a stable hash of it falls into one bucket of
`HELD_OUT_BUCKETS`. `training_conversations` never yields a held-out text and `demo_prompts`
yields only held-out texts, so the two are disjoint whatever their seeds and sizes; `exclude`
is only needed to keep out further texts.
"""

import hashlib
import random
from collections.abc import Callable

from eagleflow.demo.number_tasks import (
    addition,
    multiplication,
    sort_numbers,
    subtraction,
    unit_conversion,
)
from eagleflow.demo.problem import Problem
from eagleflow.demo.word_tasks import STRING_EDITS, WORDS, sort_words

HELD_OUT_BUCKETS = 8

SYSTEM_PROMPTS = (
    "You are a careful assistant. Think step by step before answering.",
    "You are a helpful tutor who always shows the work.",
    "Reason carefully, then give a short final answer.",
    "You are a precise assistant for arithmetic and text puzzles.",
    "Work through the problem in small steps and keep the answer brief.",
)
SYSTEM_PROMPT_PROBABILITY = 0.6


def _string_edit(rng: random.Random) -> Problem:
    return rng.choice(STRING_EDITS)(rng, rng.choice(WORDS))


def _arithmetic(rng: random.Random) -> Problem:
    return rng.choice((addition, subtraction, multiplication))(rng)


def _sorting(rng: random.Random) -> Problem:
    return rng.choice((sort_numbers, sort_words))(rng)


FAMILIES: tuple[Callable[[random.Random], Problem], ...] = (
    _arithmetic,
    _sorting,
    unit_conversion,
    _string_edit,
)


def random_problem(rng: random.Random) -> Problem:
    """One problem from a uniformly chosen family."""
    return rng.choice(FAMILIES)(rng)


def is_held_out(user_text: str) -> bool:
    """Whether a user text belongs to the held-out side of the split (stable across runs)."""
    digest = hashlib.blake2b(user_text.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def _prompt_messages(rng: random.Random, problem: Problem) -> list[dict]:
    messages = []
    if rng.random() < SYSTEM_PROMPT_PROBABILITY:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": problem.user})
    return messages


def assistant_content(problem: Problem) -> str:
    """The assistant turn: the reasoning block, a blank line, the answer sentence."""
    return f"<think>\n{problem.trace}\n</think>\n\n{problem.answer_sentence}"


def training_conversations(seed: int, n: int) -> list[list[dict]]:
    """`n` conversations (system?, user, assistant); never a held-out user text."""
    rng = random.Random(f"demo-training-{seed}")
    conversations = []
    while len(conversations) < n:
        problem = random_problem(rng)
        if is_held_out(problem.user):
            continue
        messages = _prompt_messages(rng, problem)
        messages.append({"role": "assistant", "content": assistant_content(problem)})
        conversations.append(messages)
    return conversations


def demo_prompts(
    seed: int, n: int, exclude: set[str] | None = None, *, with_answers: bool = False
) -> list[dict]:
    """`n` held-out prompt records `{"messages": [system?, user]}` with distinct user texts.

    Held out by construction (see the module docstring); user texts in `exclude` are skipped
    too. With `with_answers`, each record also carries `"answer"`, the expected final value.
    """
    rng = random.Random(f"demo-prompts-{seed}")
    seen = set(exclude or ())
    records = []
    attempts_left = 1000 + 100 * n  # the task space is huge; this only guards a bad `exclude`
    while len(records) < n:
        attempts_left -= 1
        if attempts_left < 0:
            raise ValueError(f"could not find {n} distinct held-out prompts")
        problem = random_problem(rng)
        if problem.user in seen or not is_held_out(problem.user):
            continue
        seen.add(problem.user)
        record: dict = {"messages": _prompt_messages(rng, problem)}
        if with_answers:
            record["answer"] = problem.answer
        records.append(record)
    return records
