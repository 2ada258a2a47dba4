"""Demo tasks on numbers: addition, subtraction, multiplication, sorting numbers, unit
conversion, each with several user phrasings, trace wordings and answer sentences."""

import random

from eagleflow.demo.problem import Problem, pick

PLACE_NAMES = ("ones", "tens", "hundreds", "thousands", "ten-thousands")


def _digits_low_first(value: int) -> list[int]:
    return [int(d) for d in reversed(str(value))]


def addition(rng: random.Random) -> Problem:
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
    lines = [pick(intros, variant).format(a=a, b=b)]
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
    lines.append(pick(summaries, variant).format(t=total))
    answers = (
        "{a} + {b} = {t}.",
        "The sum is {t}.",
        "The answer is {t}.",
        "Adding {a} and {b} gives {t}.",
    )
    answer_sentence = pick(answers, variant).format(a=a, b=b, t=total)
    return Problem(user, "\n".join(lines), answer_sentence, str(total))


def subtraction(rng: random.Random) -> Problem:
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
    lines = [pick(intros, variant).format(a=a, b=b)]
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
    lines.append(pick(summaries, variant).format(d=difference))
    if variant % 2 == 0:
        lines.append(f"Check: {difference} + {b} = {a}.")
    answers = (
        "{a} - {b} = {d}.",
        "The difference is {d}.",
        "The answer is {d}.",
        "Subtracting {b} from {a} leaves {d}.",
    )
    answer_sentence = pick(answers, variant).format(a=a, b=b, d=difference)
    return Problem(user, "\n".join(lines), answer_sentence, str(difference))


def _split_by_place(value: int) -> list[int]:
    """384 -> [300, 80, 4]; zero places are skipped."""
    text = str(value)
    parts = [int(d) * 10 ** (len(text) - i - 1) for i, d in enumerate(text)]
    return [part for part in parts if part]


def multiplication(rng: random.Random) -> Problem:
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
    times = pick(("×", "*"), variant)
    # Break the longer factor into place values so every partial product is easy.
    big, small = (a, b) if b < 10 else (b, a)
    parts = _split_by_place(big)
    partials = [part * small for part in parts]
    intros = (
        "Split {big} into {parts}.",
        "Write {big} as {parts} and multiply each part by {small}.",
        "Break {big} into place values: {parts}.",
    )
    lines = [pick(intros, variant).format(big=big, small=small, parts=" + ".join(map(str, parts)))]
    for part, partial in zip(parts, partials, strict=True):
        lines.append(f"{small} {times} {part} = {partial}.")
    if len(partials) > 1:
        sums = (
            "Add the parts: {p} = {r}.",
            "Sum of the partial products: {p} = {r}.",
            "Now add: {p} = {r}.",
        )
        lines.append(pick(sums, variant).format(p=" + ".join(map(str, partials)), r=product))
    answers = (
        "{a} {t} {b} = {r}.",
        "The product is {r}.",
        "The answer is {r}.",
        "Multiplying {a} by {b} gives {r}.",
    )
    answer_sentence = pick(answers, variant).format(a=a, b=b, t=times, r=product)
    return Problem(user, "\n".join(lines), answer_sentence, str(product))


def sort_numbers(rng: random.Random) -> Problem:
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
    extreme, take = ("largest", max) if descending else ("smallest", min)
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
    lines = [pick(intros, variant).format(e=extreme)]
    remaining = list(numbers)
    ordered = []
    while len(remaining) > 1:
        chosen = take(remaining)
        remaining.remove(chosen)
        ordered.append(chosen)
        rest = ", ".join(map(str, remaining))
        lines.append(pick(steps, variant).format(e=extreme, c=chosen, r=rest))
    ordered.append(remaining[0])
    lines.append(f"Only {remaining[0]} is left, so it goes last.")
    result = ", ".join(map(str, ordered))
    answers = ("Sorted: {r}.", "The sorted order is {r}.", "In order: {r}.", "The answer is {r}.")
    return Problem(user, "\n".join(lines), pick(answers, variant).format(r=result), result)


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


def unit_conversion(rng: random.Random) -> Problem:
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
        pick(rates, variant).format(u=unit, f=factor, t=target),
        pick(plans, variant).format(q=quantity, f=factor, us=units, t=target),
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
    answer_sentence = pick(answers, variant).format(q=quantity, u=units, r=result, t=target)
    return Problem(user, "\n".join(lines), answer_sentence, str(result))
