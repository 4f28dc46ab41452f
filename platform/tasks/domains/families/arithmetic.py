"""Arithmetic: several operators, signed or not, integer or decimal; difficulty = digits."""

from __future__ import annotations

import random
from decimal import Decimal
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, digits_number, numeric

_SYMBOL = {"add": "+", "sub": "-", "mul": "*"}


def _operand(rng: random.Random, digits: int, style: str) -> Decimal:
    if style == "decimal":
        places = min(3, 1 + digits // 2)
        whole = digits_number(rng, max(1, digits - 1))
        return Decimal(whole) + Decimal(rng.randint(1, 10**places - 1)) / (Decimal(10) ** places)
    value = Decimal(digits_number(rng, digits))
    if style == "signed" and rng.random() < 0.5:
        value = -value
    return value


def _show(value: Decimal) -> str:
    text = format(value.normalize(), "f") if value != 0 else "0"
    return f"({text})" if text.startswith("-") else text


def _make(op: str, style: str, rng: random.Random, difficulty: int) -> Problem:
    a, b = _operand(rng, difficulty, style), _operand(rng, difficulty, style)
    if op in _SYMBOL:
        result = a + b if op == "add" else a - b if op == "sub" else a * b
        question = f"{_show(a)} {_SYMBOL[op]} {_show(b)}"
    elif op == "div":
        divisor = Decimal(rng.randint(1, max(2, 2 * difficulty + 1))) * (
            -1 if style == "signed" and rng.random() < 0.5 else 1
        )
        result = a
        question = f"{_show(a * divisor)} / {_show(divisor)}"
    elif op == "mod":
        a, m = abs(a), Decimal(rng.randint(2, 3 + 3 * difficulty))
        result = a % m
        question = f"{_show(a)} mod {m}"
    elif op == "pow":
        base = Decimal(rng.randint(0, 3 + difficulty)) * (-1 if style == "signed" and rng.random() < 0.5 else 1)
        exponent = rng.randint(0 if base else 1, 1 + difficulty)  # 0 ** 0 is undefined
        result = base**exponent
        question = f"{_show(base)} ^ {exponent}"
    elif op == "abs_diff":
        result = abs(a - b)
        question = f"|{_show(a)} - {_show(b)}|"
    elif op in ("chain", "paren"):
        c = _operand(rng, max(1, difficulty - 1), style)
        first, second = rng.choice("+-*"), rng.choice("+-*")
        if op == "chain":
            question = f"{_show(a)} {first} {_show(b)} {second} {_show(c)}"
        else:
            question = f"{_show(a)} {first} ({_show(b)} {second} {_show(c)})"
        result = _evaluate(question)
    elif op == "sum_list":
        values = [_operand(rng, difficulty, style) for _ in range(2 + difficulty)]
        result = sum(values, Decimal(0))
        question = "the sum of " + ", ".join(_show(v) for v in values)
    else:  # pragma: no cover - guarded by the table below
        raise ValueError(op)
    return numeric(
        f"Compute {question}.", float(result), answer=format(result.normalize(), "f") if result != 0 else "0"
    )


def _evaluate(expression: str) -> Decimal:
    """Evaluate + - * and parentheses over decimals exactly (a tiny recursive-descent parser)."""
    tokens = expression.replace("(", " ( ").replace(")", " ) ").split()
    position = 0

    def atom() -> Decimal:
        nonlocal position
        token = tokens[position]
        position += 1
        if token == "(":
            if (
                tokens[position] not in ("(",)
                and tokens[position].lstrip("-").replace(".", "").isdigit()
                and tokens[position + 1] == ")"
            ):
                value = Decimal(tokens[position])
                position += 2
                return value
            value = expr()
            position += 1  # ")"
            return value
        return Decimal(token)

    def term() -> Decimal:
        nonlocal position
        value = atom()
        while position < len(tokens) and tokens[position] == "*":
            position += 1
            value *= atom()
        return value

    def expr() -> Decimal:
        nonlocal position
        value = term()
        while position < len(tokens) and tokens[position] in "+-":
            operator = tokens[position]
            position += 1
            value = value + term() if operator == "+" else value - term()
        return value

    return expr()


_OPS = ("add", "sub", "mul", "div", "mod", "pow", "abs_diff", "chain", "paren", "sum_list")


def domains() -> list[Domain]:
    found = []
    for op in _OPS:
        for style in ("int", "signed"):
            if op == "mod" and style == "signed":
                continue
            found.append(
                Domain(
                    f"arith.{op}.{style}",
                    "arithmetic",
                    f"{op} of {style} numbers",
                    partial(_make, op, style),
                    {"op": op, "style": style},
                )
            )
    for op in ("add", "sub", "mul", "sum_list", "chain", "abs_diff"):
        found.append(
            Domain(
                f"arith.{op}.decimal",
                "arithmetic",
                f"{op} of decimals",
                partial(_make, op, "decimal"),
                {"op": op, "style": "decimal"},
            )
        )
    return found
