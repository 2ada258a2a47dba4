"""Demo tasks on words: sorting words and string edits (reverse, uppercase, count or remove a
letter, length), each with several user phrasings, trace wordings and answer sentences."""

import random
from collections.abc import Callable

from eagleflow.demo.problem import Problem, pick, quote

WORDS = tuple(
    """
    apple river garden window planet silver forest candle bridge rocket pencil banana orange
    lemon tiger zebra monkey rabbit turtle dragon castle island valley meadow harbor market
    school doctor farmer singer painter winter summer autumn spring thunder cloud storm ocean
    desert jungle mountain pebble marble copper bottle basket blanket pillow mirror ladder
    hammer button carpet coffee butter cookie pepper tomato potato carrot cherry grape melon
    peach plum kettle teapot saddle wagon engine wheel anchor sailor pirate knight wizard giant
    shadow mystery puzzle riddle letter number circle square triangle yellow purple violet
    crimson golden bright gentle quiet rapid simple little narrow basil cactus daisy tulip
    orchid willow maple cedar falcon parrot penguin lizard beetle spider cobweb lantern compass
    journey ticket station airport highway tunnel village kitchen library theater museum
    camera guitar violin trumpet drummer banjo record signal rhythm galaxy comet meteor crystal
    diamond
    """.split()
)


def _distinguishing_prefix(word: str, others: list[str]) -> str:
    """Shortest prefix of `word` that no other word shares."""
    length = 1
    while any(other[:length] == word[:length] for other in others) and length < len(word):
        length += 1
    return word[:length]


def sort_words(rng: random.Random) -> Problem:
    words = rng.sample(WORDS, rng.randint(3, 5))
    asks = (
        "Sort these words alphabetically: {l}.",
        "Put the words {l} in alphabetical order.",
        "Arrange {l} from A to Z.",
        "Which order do {l} come in a dictionary?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(l=", ".join(words))
    intros = (
        "Compare the words letter by letter and pick the earliest each time.",
        "I will take the word that comes first in the alphabet, then repeat.",
    )
    steps = ("{w} comes next, because '{p}' is earliest.", "Next: {w} (starts with '{p}').")
    lines = [pick(intros, variant)]
    remaining = list(words)
    ordered = []
    while len(remaining) > 1:
        chosen = min(remaining)
        remaining.remove(chosen)
        ordered.append(chosen)
        prefix = _distinguishing_prefix(chosen, remaining)
        lines.append(pick(steps, variant).format(w=chosen, p=prefix))
    ordered.append(remaining[0])
    lines.append(f"Last: {remaining[0]}.")
    result = ", ".join(ordered)
    answers = ("Alphabetical order: {r}.", "The sorted words are {r}.", "In order: {r}.")
    return Problem(user, "\n".join(lines), pick(answers, variant).format(r=result), result)


def reverse_word(rng: random.Random, word: str) -> Problem:
    reversed_word = word[::-1]
    asks = (
        "Reverse the word {w}.",
        "What is {w} spelled backwards?",
        "Write {w} in reverse order.",
        "Spell {w} backwards.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(w=quote(rng, word))
    backwards = ("Backwards they are {l}.", "Read from the end: {l}.")
    lines = [
        f"The letters of {word} are {', '.join(word)}.",
        pick(backwards, variant).format(l=", ".join(reversed_word)),
        f"Joined together: {reversed_word}.",
    ]
    answers = ("{w} reversed is {r}.", "The reversed word is {r}.", "Backwards, it reads {r}.")
    answer_sentence = pick(answers, variant).format(w=word, r=reversed_word)
    return Problem(user, "\n".join(lines), answer_sentence, reversed_word)


def uppercase_word(rng: random.Random, word: str) -> Problem:
    upper = word.upper()
    asks = (
        "Convert {w} to uppercase.",
        "Write {w} in capital letters.",
        "What is {w} in all caps?",
        "Uppercase the word {w}.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(w=quote(rng, word))
    pairs = ", ".join(f"{low} -> {up}" for low, up in zip(word, upper, strict=True))
    steps = ("Capitalize each letter: {p}.", "Letter by letter: {p}.")
    lines = [pick(steps, variant).format(p=pairs), f"Together: {upper}."]
    answers = ("In uppercase it is {u}.", "The answer is {u}.", "{w} in capitals is {u}.")
    answer_sentence = pick(answers, variant).format(w=word, u=upper)
    return Problem(user, "\n".join(lines), answer_sentence, upper)


def count_letter(rng: random.Random, word: str) -> Problem:
    letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("aeioulnrst")
    count = word.count(letter)
    asks = (
        "How many times does the letter {c} appear in {w}?",
        "Count the letter {c} in {w}.",
        "How many {c}'s are in {w}?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(c=quote(rng, letter), w=quote(rng, word))
    lines = [f"Go through {word} letter by letter, looking for {letter}."]
    seen = 0
    for char in word:
        if char == letter:
            seen += 1
            lines.append(f"{char}: yes, {seen} so far")
        else:
            lines.append(f"{char}: no")
    lines.append(f"Total: {count}.")
    answers = (
        "The letter {c} appears {n} time{s} in {w}.",
        "The answer is {n}.",
        "There {v} {n} {c} in {w}.",
    )
    answer_sentence = pick(answers, variant).format(
        c=letter, n=count, s="" if count == 1 else "s", w=word, v="is" if count == 1 else "are"
    )
    return Problem(user, "\n".join(lines), answer_sentence, str(count))


def remove_letter(rng: random.Random, word: str) -> Problem:
    letter = rng.choice(word)
    kept = word.replace(letter, "")
    asks = (
        "Remove every {c} from {w}.",
        "Delete the letter {c} from {w}.",
        "What is {w} without the letter {c}?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(c=quote(rng, letter), w=quote(rng, word))
    lines = [
        f"Letters: {', '.join(word)}.",
        f"Drop each {letter}: {', '.join(kept)}.",
        f"Result: {kept}.",
    ]
    answers = ("Without {c}, {w} becomes {k}.", "The result is {k}.", "The answer is {k}.")
    answer_sentence = pick(answers, variant).format(c=letter, w=word, k=kept)
    return Problem(user, "\n".join(lines), answer_sentence, kept)


def word_length(rng: random.Random, word: str) -> Problem:
    asks = (
        "How many letters does {w} have?",
        "What is the length of the word {w}?",
        "Count the letters in {w}.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(w=quote(rng, word))
    numbered = " ".join(f"{char}({i})" for i, char in enumerate(word, start=1))
    lines = [f"Number the letters: {numbered}.", f"The last number is {len(word)}."]
    answers = ("{w} has {n} letters.", "The answer is {n}.", "The word is {n} letters long.")
    answer_sentence = pick(answers, variant).format(w=word, n=len(word))
    return Problem(user, "\n".join(lines), answer_sentence, str(len(word)))


STRING_EDITS: tuple[Callable[[random.Random, str], Problem], ...] = (
    reverse_word,
    uppercase_word,
    count_letter,
    remove_letter,
    word_length,
)
