"""A verifiers environment, written the way an Environments Hub package is: products of two
numbers, a ``calculator`` tool, an exact-match rubric. Nothing in it is rlmap's; rlmap trains
on it through its verifiers adapter (``data.task=verifiers:ENV_ID``, docs/tasks.md)::

    PYTHONPATH=examples rlmap train --recipe grpo model.path=embedded:tiny-chat \\
        data.task=verifiers:verifiers_calculator

The environment is verifiers' own ``ToolEnv``: it shows the tool's schema, parses the model's
tool calls, runs the tool and answers with ``tool`` messages until a turn calls no tool (or
``max_turns`` run out); its ``Rubric`` scores the final message.
"""

from __future__ import annotations

import ast
import operator
import random

import verifiers as vf
from datasets import Dataset

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers and + - * ( ), e.g. 37*85
    """

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"cannot evaluate {expression!r}")

    return str(value(ast.parse(expression, mode="eval").body))


def products(n: int, seed: int, max_digits: int) -> list[dict[str, str]]:
    """``n`` distinct questions ``a*b=`` with their answers."""
    rng, high, rows = random.Random(seed), 10**max_digits - 1, {}
    while len(rows) < n:
        a, b = rng.randint(0, high), rng.randint(0, high)
        rows.setdefault(f"{a}*{b}=", str(a * b))
    return [{"question": q, "answer": a} for q, a in rows.items()]


def load_environment(
    num_train: int = 2000,
    num_eval: int = 256,
    seed: int = 1,
    max_digits: int = 2,
    max_turns: int = 3,
) -> vf.Environment:
    rows = products(num_train + num_eval, seed, max_digits)

    def correct_answer(completion: vf.Messages, answer: str) -> float:
        """1 when the last message is the product exactly."""
        return float(str(completion[-1].content or "").strip() == answer)

    return vf.ToolEnv(
        dataset=Dataset.from_list(rows[num_eval:]),
        eval_dataset=Dataset.from_list(rows[:num_eval]),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[correct_answer]),
        max_turns=max_turns,
    )
