"""A demo task: the user text, its worked trace and answer, and the wording helpers the task
generators share (`eagleflow.demo.number_tasks`, `eagleflow.demo.word_tasks`)."""

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One generated task: the user text, the worked trace and the final answer."""

    user: str
    trace: str
    answer_sentence: str
    answer: str  # the bare final value, for cheap correctness checks


def pick(options: tuple[str, ...], variant: int) -> str:
    """The wording for this variant; the variant is the index of the user phrasing.

    Independent draws would leave the wording unpredictable from the prompt, and a greedy
    model would then answer every prompt in the single most common wording.
    """
    return options[variant % len(options)]


def quote(rng: random.Random, text: str) -> str:
    return rng.choice(("'{}'", '"{}"', "{}")).format(text)
