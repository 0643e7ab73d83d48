"""Reference answers cut out of GSM8K and MATH solutions (``data.answer_format``): hand
cases, and the row that lacks its marker named in one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmap.core.errors import InputError
from rlmap.feedback.math_equiv import MathEquiv
from rlmap.recipes import build_config
from rlmap.tasks.answers import extract_reference
from rlmap.tasks.datafiles import load_file_examples

NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
    "clips altogether in April and May.\n#### 72"
)
"""GSM8K's first training row's answer, as the dataset stores it."""


@pytest.mark.parametrize(
    ("solution", "reference"),
    [
        (NATALIA, "72"),
        ("She pays 10 * 100 = 1,000 dollars.\n#### 1,000", "1000"),  # thousands separator
        ("#### 5 #### 7", "7"),  # the last mark
        ("Lost 3 degrees.\n#### -3\n", "-3"),  # sign kept, surrounding space dropped
        ("x #### 0.5", "0.5"),
    ],
)
def test_gsm8k_reads_the_text_after_the_last_mark(solution: str, reference: str) -> None:
    assert extract_reference(solution, "gsm8k") == reference


@pytest.mark.parametrize(
    ("solution", "reference"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("so $x = \\boxed{3}$.", "3"),
        # nested groups stay inside: \sqrt{...} inside \frac{...}{...} inside \boxed{...}
        ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # two boxes: the last
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are text, not groups
        ("\\boxed{ (-\\infty, 3] }", "(-\\infty, 3]"),
    ],
)
def test_math_reads_the_content_of_the_last_box(solution: str, reference: str) -> None:
    assert extract_reference(solution, "math") == reference


def test_plain_is_the_field_as_it_is() -> None:
    assert extract_reference(" 72 #### \\boxed{1}", "plain") == " 72 #### \\boxed{1}"


@pytest.mark.parametrize(
    ("solution", "fmt", "problem"),
    [
        ("The answer is 72.", "gsm8k", "no '####' (data.answer_format=gsm8k"),
        ("so 72 ####  ", "gsm8k", "nothing after the last '####'"),
        ("The answer is $\\frac12$.", "math", "no \\boxed{...} (data.answer_format=math"),
        ("\\boxed{}", "math", "the last \\boxed{} is empty"),
        # "ab \boxed{1": the box starts at character 4, and its brace is never closed
        ("ab \\boxed{1", "math", "the last \\boxed{ (character 4) is never closed"),
        # one brace short: {1} and {2} close, the box's own brace never does
        ("\\boxed{\\frac{1}{2}", "math", "the last \\boxed{ (character 1) is never closed"),
    ],
)
def test_a_solution_without_its_answer_is_refused(solution: str, fmt: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        extract_reference(solution, fmt)  # type: ignore[arg-type]
    assert str(err.value).startswith(problem) and "\n" not in str(err.value)


def test_the_row_without_a_mark_is_named_in_one_line(tmp_path: Path) -> None:
    rows = [
        {"question": "How many?", "answer": NATALIA},
        {"question": "And now?", "answer": "They sold 72.\nThe end."},
    ]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError) as err:
        load_file_examples(path, "question", "answer", "gsm8k")
    line = str(err.value)
    assert line.startswith(f"{path}:2: field 'answer': no '####'") and "\n" not in line
    assert "'They sold 72.\\nThe end.'" in line  # what the field holds, as one line


def test_a_chat_rows_answer_is_read_from_its_final_message(tmp_path: Path) -> None:
    def chat(answer: str) -> dict[str, object]:
        return {
            "messages": [
                {"role": "user", "content": "Half of 1?"},
                {"role": "assistant", "content": answer},
            ]
        }

    path = tmp_path / "math.json"
    path.write_text(json.dumps([chat("It is $\\boxed{\\frac{1}{2}}$."), chat("It is 1/2.")]))
    with pytest.raises(InputError, match=r"math\.json row 1: the final assistant message: no "):
        load_file_examples(path, answer_format="math")
    path.write_text(json.dumps([chat("It is $\\boxed{\\frac{1}{2}}$.")]))
    (example,) = load_file_examples(path, answer_format="math")
    assert (example.prompt, example.answer) == ("Half of 1?", "\\frac{1}{2}")


def test_the_prompt_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "Q #### 1?", "answer": NATALIA}) + "\n")
    (example,) = load_file_examples(path, "question", "answer", "gsm8k")
    assert (example.prompt, example.answer) == ("Q #### 1?", "72")


def test_solution_formats_score_with_math_equiv_unless_a_verifier_is_named() -> None:
    for fmt in ("gsm8k", "math"):
        cfg = build_config("grpo", None, ["data.task=x.jsonl", f"data.answer_format={fmt}"])
        assert cfg.feedback.verifier == "math_equiv"
    named = ["data.task=x.jsonl", "data.answer_format=gsm8k", "feedback.verifier=last_number"]
    assert build_config("grpo", None, named).feedback.verifier == "last_number"
    assert build_config("grpo", None, ["data.task=x.jsonl"]).feedback.verifier == "exact_match"


def test_an_answer_format_is_refused_where_there_are_no_rows() -> None:
    from rlmap.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^data\.answer_format: only data files and hf: "):
        build_config("grpo", None, ["data.task=arithmetic", "data.answer_format=gsm8k"])
    with pytest.raises(ConfigError, match=r"^data\.answer_format: Input should be 'plain'"):
        build_config("grpo", None, ["data.task=x.jsonl", "data.answer_format=gsm9k"])


@pytest.fixture(scope="module")
def math_equiv() -> Iterator[MathEquiv]:
    verifier = MathEquiv(timeout_seconds=10.0)
    yield verifier
    verifier.close()


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("\\boxed{2\\sqrt{3}}", "2\\sqrt{3}", 1.0),
        ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", 1.0),  # √12 = 2√3
        ("\\boxed{2}", "2\\sqrt{3}", 0.0),  # read as written, the reference was its "2"
        ("\\boxed{3}", "3\\pi", 0.0),
        ("\\boxed{(-\\infty, 3]}", "(-\\infty, 3]", 1.0),
    ],
)
def test_math_references_out_of_a_box_are_read_as_latex(
    math_equiv: MathEquiv, response: str, reference: str, reward: float
) -> None:
    assert math_equiv(response, reference) == reward
