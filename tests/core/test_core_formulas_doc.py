"""docs/formulas.md, the formulas document the code cites, checked against the code.

- every citation "docs/formulas.md §n" in src/rlmap and docs/ names a section heading of
  the document (and every §n the document uses internally exists);
- no citation names "FORMULAS §n" or "FORMULAS.md §n", a file outside the repository;
- every numbered heading carries its stable anchor (``<a id="s2-1"></a>`` for §2.1);
- every backticked ``rlmap.…`` name resolves (module, function, class, field, registry
  entry ``registry["name"]``), every registry the document names lists all its entries,
  and every ``rlmap.….NAME = value``, ``section.field = value`` and
  ``preset: section.field = value`` it states is the code's value.

The checks are plain functions of text, so the last tests feed them broken text and see
them fail.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from rlmap.core.registry import Registry
from rlmap.recipes.catalog import preset
from rlmap.recipes.config import RecipeConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "formulas.md"
CITING = (ROOT / "src" / "rlmap", ROOT / "docs")
"""Where citations are looked for: the package's sources and the other documents."""

PENDING: dict[str, str] = {}
"""Files that may still cite FORMULAS.md because their owners were editing them when the
citations were re-pointed. A file leaves this list once its citation names the document."""

_SECTION = r"\d+(?:\.\d+)*"
CITATION = re.compile(
    rf"(?P<file>docs/formulas\.md|FORMULAS(?:\.md)?)\s+"
    rf"(?P<refs>§{_SECTION}(?:\s*[–-]\s*§?{_SECTION})?(?:\s*,\s*§{_SECTION})*)"
)
"""A citation: the file, then §n, a range §n–m, or a list §n, §m, …"""
STALE = re.compile(r"FORMULAS(?:\.md)?\s*§")
HEADING = re.compile(rf"^#{{2,4}}\s+(?P<num>{_SECTION})\.?\s", re.MULTILINE)
ANCHOR = re.compile(r'^<a id="(?P<id>[^"]+)"></a>$')
CODE_NAME = re.compile(
    r'`(?P<name>rlmap(?:\.\w+)+)(?:\["(?P<key>[\w-]+)"\])?(?: = (?P<value>[^`]+))?`'
)
SETTING = re.compile(
    r"`(?:(?P<presets>[a-z][a-z-]*(?:, [a-z][a-z-]*)*): )?"
    r"(?P<section>[a-z_]+)\.(?P<field>[a-z_]+) = (?P<value>[^`]+)`"
)


def sections(doc: str) -> set[str]:
    """The section numbers of the document's numbered headings, e.g. {"1", "2", "2.1"}."""
    return {m["num"] for m in HEADING.finditer(doc)}


def cited(refs: str) -> list[str]:
    """Section numbers of one citation's references; an integer range names every section."""
    out: list[str] = []
    for part in re.split(r"\s*,\s*", refs):
        ends = [e.strip().lstrip("§") for e in re.split(r"[–-]", part)]
        if len(ends) == 2 and ends[0].isdigit() and ends[1].isdigit():
            out += [str(n) for n in range(int(ends[0]), int(ends[1]) + 1)]
        else:
            out += ends
    return out


def citation_problems(doc: str, sources: Mapping[str, str]) -> list[str]:
    """'path: problem' for each citation of a section the document lacks."""
    have = sections(doc)
    problems = []
    for path, text in sources.items():
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            missing = [n for n in cited(m["refs"]) if n not in have]
            if missing:
                where = ", ".join(f"§{n}" for n in missing)
                problems.append(f"{path}:{line}: cites {where}, not a heading of docs/formulas.md")
    for n in re.findall(rf"§({_SECTION})", doc):
        if n.rstrip(".") not in have:
            problems.append(f"docs/formulas.md: refers to §{n}, not one of its headings")
    return problems


def stale_problems(sources: Mapping[str, str], pending: Mapping[str, str]) -> list[str]:
    """'path:line: …' for each citation of FORMULAS(.md) outside ``pending``, and each
    ``pending`` entry that no longer needs to be there."""
    problems = []
    for path, text in sources.items():
        hits = [text.count("\n", 0, m.start()) + 1 for m in STALE.finditer(text)]
        if path in pending and not hits:
            problems.append(f"{path}: cites no FORMULAS §n any more; remove it from PENDING")
        elif hits and path not in pending:
            problems += [f"{path}:{n}: cites FORMULAS §n; write docs/formulas.md §n" for n in hits]
    return problems


def anchor_problems(doc: str) -> list[str]:
    """Each numbered heading must follow its anchor line ``<a id="s2-1"></a>``."""
    lines = doc.splitlines()
    problems = []
    for i, line in enumerate(lines):
        m = HEADING.match(line)
        if m is None:
            continue
        want = "s" + m["num"].replace(".", "-")
        above = ANCHOR.match(lines[i - 1]) if i else None
        if above is None or above["id"] != want:
            problems.append(f'docs/formulas.md:{i + 1}: §{m["num"]} needs <a id="{want}"> above')
    return problems


def resolve(dotted: str) -> Any:
    """The object a dotted name ``rlmap.module.attr.attr`` names; AttributeError if none.

    A dataclass field without a default is not a class attribute, so it resolves to its
    ``dataclasses.Field``.
    """
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError:
            continue
        for attr in parts[k:]:
            fields = (
                {f.name: f for f in dataclasses.fields(obj)}
                if dataclasses.is_dataclass(obj)
                else {}
            )
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in fields:
                obj = fields[attr]
            else:
                raise AttributeError(f"{dotted}: {obj!r} has no attribute {attr!r}")
        return obj
    raise ModuleNotFoundError(dotted)


def code_name_problems(doc: str) -> list[str]:
    """Backticked rlmap names that do not resolve, registry keys that are not registered,
    constants whose value differs, and registries with entries the document omits."""
    problems = []
    listed: dict[str, set[str]] = {}
    for m in CODE_NAME.finditer(doc):
        try:
            obj = resolve(m["name"])
        except (AttributeError, ModuleNotFoundError) as exc:
            problems.append(f"`{m['name']}` does not resolve ({exc})")
            continue
        if m["key"] is not None:
            if not isinstance(obj, Registry) or m["key"] not in obj:
                problems.append(f'`{m["name"]}["{m["key"]}"]` is not a registered entry')
            listed.setdefault(m["name"], set()).add(m["key"])
        elif m["value"] is not None and not same(obj, ast.literal_eval(m["value"])):
            problems.append(f"`{m['name']}` is {obj!r} in the code, the document says {m['value']}")
    for name, keys in listed.items():
        missing = sorted(set(resolve(name).names()) - keys)
        if missing:
            problems.append(f"`{name}`: entries {missing} are registered but not documented")
    return problems


def same(got: Any, want: Any) -> bool:
    """Equal and of the same type (so that `1` is not accepted for a float default)."""
    return type(got) is type(want) and got == want


def setting_problems(doc: str) -> list[str]:
    """Each `section.field = value` must be the field's default, each
    `preset, …: section.field = value` that preset's value."""
    default = RecipeConfig()
    problems = []
    for m in SETTING.finditer(doc):
        section, field = m["section"], m["field"]
        if section not in RecipeConfig.model_fields:
            continue
        want = ast.literal_eval(m["value"])
        names = m["presets"].split(", ") if m["presets"] else [None]
        for name in names:
            cfg = default if name is None else preset(name)
            got = getattr(getattr(cfg, section), field)
            if not same(got, want):
                who = "the default" if name is None else f"preset {name}"
                problems.append(f"{section}.{field}: {who} is {got!r}, the document says {want!r}")
    return problems


def read_sources(roots: Iterable[Path]) -> dict[str, str]:
    """Every .py and .md file under ``roots`` except the document itself, by repository path."""
    out = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".md") and path != DOC and path.is_file():
                out[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_the_document_keeps_the_contract_sections_one_to_nine(doc: str) -> None:
    # FORMULAS.md has §1–§9; its three unnumbered subsections of §2 are §2.1–§2.3 here
    assert {str(n) for n in range(1, 10)} | {"2.1", "2.2", "2.3"} <= sections(doc)


def test_every_cited_section_exists(doc: str) -> None:
    assert citation_problems(doc, read_sources(CITING)) == []


def test_no_citation_names_a_file_outside_the_repository() -> None:
    assert stale_problems(read_sources(CITING), PENDING) == []


def test_every_section_has_a_stable_anchor(doc: str) -> None:
    assert anchor_problems(doc) == []


def test_every_code_name_resolves_and_every_registry_is_complete(doc: str) -> None:
    assert code_name_problems(doc) == []


def test_every_default_and_preset_value_is_the_codes(doc: str) -> None:
    assert setting_problems(doc) == []


# ------------------------------------------------------------------ the checks can fail


def test_a_removed_heading_or_a_citation_of_section_99_is_caught(doc: str) -> None:
    without_21 = doc.replace("### 2.1 GAE", "### GAE", 1)
    gae = {"src/rlmap/estimators/gae.py": "Notation (docs/formulas.md §2.1, Schulman)"}
    assert citation_problems(doc, gae) == []
    problems = citation_problems(without_21, gae)
    assert "src/rlmap/estimators/gae.py:1: cites §2.1, not a heading of docs/formulas.md" in (
        problems
    )
    assert "docs/formulas.md: refers to §2.1, not one of its headings" in problems  # its own §2.1s
    assert anchor_problems(without_21) == []  # the anchor without a heading is harmless
    bad = {"x.py": '"""Doc.\n\nSee (docs/formulas.md §1, §99).\n"""'}
    assert citation_problems(doc, bad) == ["x.py:3: cites §99, not a heading of docs/formulas.md"]


def test_ranges_and_lists_are_read_whole() -> None:
    assert cited("§1, §3, §4") == ["1", "3", "4"]
    assert cited("§3–4") == ["3", "4"]
    assert cited("§2.1") == ["2.1"]


def test_a_bare_formulas_citation_is_caught_and_a_stale_exemption_too() -> None:
    sources = {
        "a.py": "x  # FORMULAS §4",
        "b.md": "\n(FORMULAS.md §7)",
        "c.py": "docs/formulas.md §4",
    }
    assert stale_problems(sources, {}) == [
        "a.py:1: cites FORMULAS §n; write docs/formulas.md §n",
        "b.md:2: cites FORMULAS §n; write docs/formulas.md §n",
    ]
    everything_pending = dict.fromkeys(sources, "pending")
    assert stale_problems(sources, everything_pending) == [
        "c.py: cites no FORMULAS §n any more; remove it from PENDING"
    ]


def test_a_wrong_default_an_unknown_name_and_a_missing_entry_are_caught() -> None:
    assert setting_problems("`behaviour.clip_low = 0.3`") == [
        "behaviour.clip_low: the default is 0.2, the document says 0.3"
    ]
    assert setting_problems("`dapo: behaviour.clip_high = 0.2`") == [
        "behaviour.clip_high: preset dapo is 0.28, the document says 0.2"
    ]
    assert setting_problems("`credit.gamma = 1`") != []  # an int for a float default
    assert code_name_problems("`rlmap.estimators.gae.no_such_function`") != []
    assert code_name_problems("`rlmap.correction.ratios.LOG_RATIO_BOUND = 10.0`") != []
    missing = code_name_problems('`rlmap.reduction.registry["token_mean"]`')
    assert missing == [
        "`rlmap.reduction.registry`: entries ['fixed_budget', 'prompt_mean', 'response_mean', "
        "'seq_mean_token_sum', 'token_sum'] are registered but not documented"
    ]
