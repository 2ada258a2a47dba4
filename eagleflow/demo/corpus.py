"""Seeded synthetic corpus of short reasoning conversations for the demo target.

Four families (integer arithmetic, sorting, unit conversion, string edits), each with several
user phrasings, trace wordings and answer sentences, so a model trained on it does not answer
with one fixed template. Every answer is computed, hence correct.

The user phrasing picks the wording of the whole answer (see `_pick`), so a greedy model can
tell from the prompt which wording to use and its answers vary from prompt to prompt.

Held-out split: a user text is *held out* when a stable hash of it falls into one bucket of
`HELD_OUT_BUCKETS`. `training_conversations` never yields a held-out text and `demo_prompts`
yields only held-out texts, so the two are disjoint whatever their seeds and sizes; `exclude`
is only needed to keep out further texts.
"""

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

HELD_OUT_BUCKETS = 8

SYSTEM_PROMPTS = (
    "You are a careful assistant. Think step by step before answering.",
    "You are a helpful tutor who always shows the work.",
    "Reason carefully, then give a short final answer.",
    "You are a precise assistant for arithmetic and text puzzles.",
    "Work through the problem in small steps and keep the answer brief.",
)
SYSTEM_PROMPT_PROBABILITY = 0.6

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

PLACE_NAMES = ("ones", "tens", "hundreds", "thousands", "ten-thousands")


@dataclass(frozen=True)
class Problem:
    """One generated task: the user text, the worked trace and the final answer."""

    user: str
    trace: str
    answer_sentence: str
    answer: str  # the bare final value, for cheap correctness checks


def _pick(options: tuple[str, ...], variant: int) -> str:
    """The wording for this variant; the variant is the index of the user phrasing.

    Independent draws would leave the wording unpredictable from the prompt, and a greedy
    model would then answer every prompt in the single most common wording.
    """
    return options[variant % len(options)]


def _digits_low_first(value: int) -> list[int]:
    return [int(d) for d in reversed(str(value))]


def _quote(rng: random.Random, text: str) -> str:
    return rng.choice(("'{}'", '"{}"', "{}")).format(text)


def _addition(rng: random.Random) -> Problem:
    a, b = rng.randint(10, 9999), rng.randint(10, 999)
    if rng.random() < 0.5:
        a, b = b, a
    total = a + b
    asks = (
        "What is {a} + {b}?",
        "Compute {a} plus {b}.",
        "Please add {a} and {b}.",
        "Can you work out the sum of {a} and {b}?",
        "I need {a} + {b}. Show your steps.",
        "Add {b} to {a}.",
        "What do you get when you add {a} and {b}?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(a=a, b=b)
    intros = (
        "Add {a} and {b} column by column, starting from the ones place.",
        "Line the numbers up and add digit by digit, right to left.",
        "I will add {a} and {b} one place value at a time.",
    )
    lines = [_pick(intros, variant).format(a=a, b=b)]
    digits_a, digits_b = _digits_low_first(a), _digits_low_first(b)
    carry = 0
    for place in range(max(len(digits_a), len(digits_b))):
        x = digits_a[place] if place < len(digits_a) else 0
        y = digits_b[place] if place < len(digits_b) else 0
        column_sum = x + y + carry
        digit, new_carry = column_sum % 10, column_sum // 10
        name = PLACE_NAMES[place]
        plus_carry = f" + {carry}" if carry else ""
        style = variant % 3
        if style == 0:
            carry_text = f", carry {new_carry}" if new_carry else ""
            lines.append(
                f"{name.capitalize()}: {x} + {y}{plus_carry} = {column_sum}, "
                f"write {digit}{carry_text}."
            )
        elif style == 1:
            carry_text = " and carry 1" if new_carry else ""
            lines.append(
                f"In the {name} place, {x} + {y}{plus_carry} makes {column_sum}; "
                f"keep {digit}{carry_text}."
            )
        else:
            carry_text = ", carry 1" if new_carry else ""
            lines.append(
                f"{name}: {x}{plus_carry} + {y} = {column_sum} -> digit {digit}{carry_text}"
            )
        carry = new_carry
    if carry:
        lines.append(f"The last carry {carry} becomes the leading digit.")
    summaries = ("So the sum is {t}.", "Reading the digits: {t}.", "That gives {t}.", "Sum: {t}.")
    lines.append(_pick(summaries, variant).format(t=total))
    answers = (
        "{a} + {b} = {t}.",
        "The sum is {t}.",
        "The answer is {t}.",
        "Adding {a} and {b} gives {t}.",
    )
    answer_sentence = _pick(answers, variant).format(a=a, b=b, t=total)
    return Problem(user, "\n".join(lines), answer_sentence, str(total))


def _subtraction(rng: random.Random) -> Problem:
    a, b = sorted((rng.randint(10, 9999), rng.randint(10, 9999)), reverse=True)
    difference = a - b
    asks = (
        "What is {a} - {b}?",
        "Compute {a} minus {b}.",
        "Subtract {b} from {a}.",
        "How much is {a} take away {b}?",
        "Find the difference between {a} and {b}.",
        "Please work out {a} - {b} step by step.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(a=a, b=b)
    intros = (
        "Subtract {b} from {a} column by column, starting with the ones.",
        "Work right to left, borrowing when a digit is too small.",
        "Take {b} away from {a} one place at a time.",
    )
    lines = [_pick(intros, variant).format(a=a, b=b)]
    digits_a, digits_b = _digits_low_first(a), _digits_low_first(b)
    borrow = 0
    for place, top in enumerate(digits_a):
        bottom = digits_b[place] if place < len(digits_b) else 0
        name = PLACE_NAMES[place].capitalize()
        after_borrow = top - borrow
        lent = f"{top} - 1 borrowed = {after_borrow}; " if borrow else ""
        if after_borrow < bottom:
            digit = after_borrow + 10 - bottom
            lines.append(
                f"{name}: {lent}{after_borrow} is less than {bottom}, so borrow: "
                f"{after_borrow + 10} - {bottom} = {digit}."
            )
            borrow = 1
        else:
            digit = after_borrow - bottom
            lines.append(f"{name}: {lent}{after_borrow} - {bottom} = {digit}.")
            borrow = 0
    summaries = (
        "Dropping leading zeros, the difference is {d}.",
        "So the result is {d}.",
        "The digits read {d}.",
    )
    lines.append(_pick(summaries, variant).format(d=difference))
    if variant % 2 == 0:
        lines.append(f"Check: {difference} + {b} = {a}.")
    answers = (
        "{a} - {b} = {d}.",
        "The difference is {d}.",
        "The answer is {d}.",
        "Subtracting {b} from {a} leaves {d}.",
    )
    answer_sentence = _pick(answers, variant).format(a=a, b=b, d=difference)
    return Problem(user, "\n".join(lines), answer_sentence, str(difference))


def _split_by_place(value: int) -> list[int]:
    """384 -> [300, 80, 4]; zero places are skipped."""
    text = str(value)
    parts = [int(d) * 10 ** (len(text) - i - 1) for i, d in enumerate(text)]
    return [part for part in parts if part]


def _multiplication(rng: random.Random) -> Problem:
    a = rng.randint(12, 999)
    b = rng.randint(2, 9) if rng.random() < 0.5 else rng.randint(11, 99)
    product = a * b
    asks = (
        "What is {a} × {b}?",
        "Compute {a} times {b}.",
        "Multiply {a} by {b}.",
        "What is {a} * {b}?",
        "What is the product of {a} and {b}?",
        "How much is {a} multiplied by {b}?",
        "Please calculate {a} × {b} and show the steps.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(a=a, b=b)
    times = _pick(("×", "*"), variant)
    # Break the longer factor into place values so every partial product is easy.
    big, small = (a, b) if b < 10 else (b, a)
    parts = _split_by_place(big)
    partials = [part * small for part in parts]
    intros = (
        "Split {big} into {parts}.",
        "Write {big} as {parts} and multiply each part by {small}.",
        "Break {big} into place values: {parts}.",
    )
    lines = [_pick(intros, variant).format(big=big, small=small, parts=" + ".join(map(str, parts)))]
    for part, partial in zip(parts, partials, strict=True):
        lines.append(f"{small} {times} {part} = {partial}.")
    if len(partials) > 1:
        sums = (
            "Add the parts: {p} = {r}.",
            "Sum of the partial products: {p} = {r}.",
            "Now add: {p} = {r}.",
        )
        lines.append(_pick(sums, variant).format(p=" + ".join(map(str, partials)), r=product))
    answers = (
        "{a} {t} {b} = {r}.",
        "The product is {r}.",
        "The answer is {r}.",
        "Multiplying {a} by {b} gives {r}.",
    )
    answer_sentence = _pick(answers, variant).format(a=a, b=b, t=times, r=product)
    return Problem(user, "\n".join(lines), answer_sentence, str(product))


def _sort_numbers(rng: random.Random) -> Problem:
    numbers = rng.sample(range(1, 100), rng.randint(4, 6))
    descending = rng.random() < 0.3
    if descending:
        asks = (
            "Sort these numbers from largest to smallest: {l}.",
            "Put {l} in descending order.",
            "Order the numbers {l} from biggest to smallest.",
        )
    else:
        asks = (
            "Sort these numbers from smallest to largest: {l}.",
            "Put {l} in ascending order.",
            "Can you sort {l}?",
            "Arrange the numbers {l} in increasing order.",
        )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(l=", ".join(map(str, numbers)))
    extreme, pick = ("largest", max) if descending else ("smallest", min)
    intros = (
        "Repeatedly take the {e} number that is left.",
        "I will pick the {e} remaining number each time.",
        "Select the {e} value, remove it, and repeat.",
    )
    # Restating what is left makes each step a copy from the line above: the copying practice
    # that teaches the small model to carry numbers over from the prompt.
    steps = (
        "The {e} of what is left is {c}; remaining: {r}.",
        "Take {c}. Left: {r}.",
        "Next is {c}, leaving {r}.",
    )
    lines = [_pick(intros, variant).format(e=extreme)]
    remaining = list(numbers)
    ordered = []
    while len(remaining) > 1:
        chosen = pick(remaining)
        remaining.remove(chosen)
        ordered.append(chosen)
        rest = ", ".join(map(str, remaining))
        lines.append(_pick(steps, variant).format(e=extreme, c=chosen, r=rest))
    ordered.append(remaining[0])
    lines.append(f"Only {remaining[0]} is left, so it goes last.")
    result = ", ".join(map(str, ordered))
    answers = ("Sorted: {r}.", "The sorted order is {r}.", "In order: {r}.", "The answer is {r}.")
    return Problem(user, "\n".join(lines), _pick(answers, variant).format(r=result), result)


def _distinguishing_prefix(word: str, others: list[str]) -> str:
    """Shortest prefix of `word` that no other word shares."""
    length = 1
    while any(other[:length] == word[:length] for other in others) and length < len(word):
        length += 1
    return word[:length]


def _sort_words(rng: random.Random) -> Problem:
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
    lines = [_pick(intros, variant)]
    remaining = list(words)
    ordered = []
    while len(remaining) > 1:
        chosen = min(remaining)
        remaining.remove(chosen)
        ordered.append(chosen)
        prefix = _distinguishing_prefix(chosen, remaining)
        lines.append(_pick(steps, variant).format(w=chosen, p=prefix))
    ordered.append(remaining[0])
    lines.append(f"Last: {remaining[0]}.")
    result = ", ".join(ordered)
    answers = ("Alphabetical order: {r}.", "The sorted words are {r}.", "In order: {r}.")
    return Problem(user, "\n".join(lines), _pick(answers, variant).format(r=result), result)


# (unit, plural, target plural, factor)
CONVERSIONS = (
    ("kilometer", "kilometers", "meters", 1000),
    ("meter", "meters", "centimeters", 100),
    ("centimeter", "centimeters", "millimeters", 10),
    ("kilogram", "kilograms", "grams", 1000),
    ("liter", "liters", "milliliters", 1000),
    ("ton", "tons", "kilograms", 1000),
    ("hour", "hours", "minutes", 60),
    ("minute", "minutes", "seconds", 60),
    ("day", "days", "hours", 24),
    ("week", "weeks", "days", 7),
    ("foot", "feet", "inches", 12),
    ("yard", "yards", "feet", 3),
)


def _unit_conversion(rng: random.Random) -> Problem:
    unit, units, target, factor = rng.choice(CONVERSIONS)
    quantity = rng.randint(2, 250)
    result = quantity * factor
    asks = (
        "How many {t} are in {q} {u}?",
        "Convert {q} {u} to {t}.",
        "{q} {u} is how many {t}?",
        "Express {q} {u} in {t}, please.",
        "What is {q} {u} in {t}?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(q=quantity, u=units, t=target)
    rates = ("One {u} is {f} {t}.", "There are {f} {t} in one {u}.", "1 {u} = {f} {t}.")
    plans = ("So multiply {q} by {f}.", "So {q} {us} = {q} × {f} {t}.")
    lines = [
        _pick(rates, variant).format(u=unit, f=factor, t=target),
        _pick(plans, variant).format(q=quantity, f=factor, us=units, t=target),
    ]
    tens, ones = quantity - quantity % 10, quantity % 10
    if factor in (10, 100, 1000):
        zeros = len(str(factor)) - 1
        lines.append(
            f"Multiplying by {factor} appends {zeros} zero{'s' if zeros > 1 else ''}: "
            f"{quantity} becomes {result}."
        )
    elif tens and ones:
        lines.append(
            f"{quantity} × {factor} = {tens} × {factor} + {ones} × {factor} = "
            f"{tens * factor} + {ones * factor} = {result}."
        )
    else:
        lines.append(f"{quantity} × {factor} = {result}.")
    answers = (
        "{q} {u} is {r} {t}.",
        "That is {r} {t}.",
        "The answer is {r} {t}.",
        "{q} {u} equals {r} {t}.",
    )
    answer_sentence = _pick(answers, variant).format(q=quantity, u=units, r=result, t=target)
    return Problem(user, "\n".join(lines), answer_sentence, str(result))


def _reverse_word(rng: random.Random, word: str) -> Problem:
    reversed_word = word[::-1]
    asks = (
        "Reverse the word {w}.",
        "What is {w} spelled backwards?",
        "Write {w} in reverse order.",
        "Spell {w} backwards.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(w=_quote(rng, word))
    backwards = ("Backwards they are {l}.", "Read from the end: {l}.")
    lines = [
        f"The letters of {word} are {', '.join(word)}.",
        _pick(backwards, variant).format(l=", ".join(reversed_word)),
        f"Joined together: {reversed_word}.",
    ]
    answers = ("{w} reversed is {r}.", "The reversed word is {r}.", "Backwards, it reads {r}.")
    answer_sentence = _pick(answers, variant).format(w=word, r=reversed_word)
    return Problem(user, "\n".join(lines), answer_sentence, reversed_word)


def _uppercase_word(rng: random.Random, word: str) -> Problem:
    upper = word.upper()
    asks = (
        "Convert {w} to uppercase.",
        "Write {w} in capital letters.",
        "What is {w} in all caps?",
        "Uppercase the word {w}.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(w=_quote(rng, word))
    pairs = ", ".join(f"{low} -> {up}" for low, up in zip(word, upper, strict=True))
    steps = ("Capitalize each letter: {p}.", "Letter by letter: {p}.")
    lines = [_pick(steps, variant).format(p=pairs), f"Together: {upper}."]
    answers = ("In uppercase it is {u}.", "The answer is {u}.", "{w} in capitals is {u}.")
    answer_sentence = _pick(answers, variant).format(w=word, u=upper)
    return Problem(user, "\n".join(lines), answer_sentence, upper)


def _count_letter(rng: random.Random, word: str) -> Problem:
    letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("aeioulnrst")
    count = word.count(letter)
    asks = (
        "How many times does the letter {c} appear in {w}?",
        "Count the letter {c} in {w}.",
        "How many {c}'s are in {w}?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(c=_quote(rng, letter), w=_quote(rng, word))
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
    answer_sentence = _pick(answers, variant).format(
        c=letter, n=count, s="" if count == 1 else "s", w=word, v="is" if count == 1 else "are"
    )
    return Problem(user, "\n".join(lines), answer_sentence, str(count))


def _remove_letter(rng: random.Random, word: str) -> Problem:
    letter = rng.choice(word)
    kept = word.replace(letter, "")
    asks = (
        "Remove every {c} from {w}.",
        "Delete the letter {c} from {w}.",
        "What is {w} without the letter {c}?",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(c=_quote(rng, letter), w=_quote(rng, word))
    lines = [
        f"Letters: {', '.join(word)}.",
        f"Drop each {letter}: {', '.join(kept)}.",
        f"Result: {kept}.",
    ]
    answers = ("Without {c}, {w} becomes {k}.", "The result is {k}.", "The answer is {k}.")
    answer_sentence = _pick(answers, variant).format(c=letter, w=word, k=kept)
    return Problem(user, "\n".join(lines), answer_sentence, kept)


def _word_length(rng: random.Random, word: str) -> Problem:
    asks = (
        "How many letters does {w} have?",
        "What is the length of the word {w}?",
        "Count the letters in {w}.",
    )
    variant = rng.randrange(len(asks))
    user = asks[variant].format(w=_quote(rng, word))
    numbered = " ".join(f"{char}({i})" for i, char in enumerate(word, start=1))
    lines = [f"Number the letters: {numbered}.", f"The last number is {len(word)}."]
    answers = ("{w} has {n} letters.", "The answer is {n}.", "The word is {n} letters long.")
    answer_sentence = _pick(answers, variant).format(w=word, n=len(word))
    return Problem(user, "\n".join(lines), answer_sentence, str(len(word)))


STRING_EDITS: tuple[Callable[[random.Random, str], Problem], ...] = (
    _reverse_word,
    _uppercase_word,
    _count_letter,
    _remove_letter,
    _word_length,
)


def _string_edit(rng: random.Random) -> Problem:
    return rng.choice(STRING_EDITS)(rng, rng.choice(WORDS))


def _arithmetic(rng: random.Random) -> Problem:
    return rng.choice((_addition, _subtraction, _multiplication))(rng)


def _sorting(rng: random.Random) -> Problem:
    return rng.choice((_sort_numbers, _sort_words))(rng)


FAMILIES: tuple[Callable[[random.Random], Problem], ...] = (
    _arithmetic,
    _sorting,
    _unit_conversion,
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
