"""Helpers of the bad-input suite: a workspace that builds inputs, and a hash of its tree.

Every case runs ``rlmap.cli.main`` in-process with the workspace as the working
directory, so the default output roots (``runs/``, ``reports/``, ``reward_models/``)
land inside it and the tree hash sees them. Nothing here may train: the ``ws``
fixture replaces the training entry points by functions that raise, so a case that
got past input checking fails loudly instead of running for minutes.

(Not a ``conftest.py``: a second module named ``conftest`` would shadow the one in
``tests/`` for the tests that import helpers from it.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest


def tree_hash(root: Path) -> str:
    """SHA-256 over every entry under ``root``: relative path, kind, and content or target.

    A new, removed, renamed or changed file or directory (an empty one included)
    changes the hash; modification times do not.
    """
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                entry = b"L" + os.readlink(path).encode()
            elif path.is_dir():
                entry = b"D"
            else:
                entry = b"F" + hashlib.sha256(path.read_bytes()).digest()
            digest.update(rel.encode() + b"\0" + entry + b"\0")
    return digest.hexdigest()


GOOD_ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10, 40)]
"""A valid JSONL task: 30 short prompts."""


@dataclass(frozen=True)
class Workspace:
    """The directory a case runs in, with helpers that build its inputs (paths relative)."""

    root: Path
    model_dir: Path
    """The session's tiny model (outside the workspace); :meth:`model` copies it in."""

    def file(self, name: str, content: str | bytes) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return name

    def dir(self, name: str) -> str:
        (self.root / name).mkdir(parents=True, exist_ok=True)
        return name

    def jsonl(self, name: str, rows: Iterable[object]) -> str:
        return self.file(name, "".join(json.dumps(r) + "\n" for r in rows))

    def model(self, name: str = "model") -> str:
        """A copy of the tiny model (config, weights, tokenizer), to damage at will."""
        shutil.copytree(self.model_dir, self.root / name)
        return name

    def run(
        self,
        name: str = "run",
        *,
        config: str | bytes = "# grpo: composition\nrecipe: grpo\nseed: 0\n",
        metrics: str | bytes | None = '{"step": 0, "eval/pass@1": 0.1}\n{"step": 1}\n',
        ledger: str | bytes | None = '{"generated_tokens": 100}\n',
        summary: str | bytes | None = '{"after": {"eval/pass@1": 0.2}}\n',
    ) -> str:
        """A finished run directory as ``rlmap train`` leaves it (the files compare reads)."""
        self.file(f"{name}/config.yaml", config)
        for filename, content in (
            ("metrics.jsonl", metrics),
            ("ledger.json", ledger),
            ("summary.json", summary),
        ):
            if content is not None:
                self.file(f"{name}/{filename}", content)
        return name


def _no_work(what: str) -> Callable[..., None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a bad-input case reached {what}")

    return refuse


@pytest.fixture(name="ws")
def ws_fixture(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """An empty workspace as the working directory; training and warm starts forbidden."""
    import rlmap.experiments.train as train
    import rlmap.learned.reward_model as reward_model

    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("RLMAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(train, "run_training", _no_work("training"))
    monkeypatch.setattr(reward_model, "train_reward_model", _no_work("reward-model training"))
    monkeypatch.setattr("rlmap.assembly.models.warm_start", _no_work("the embedded warm start"))
    return Workspace(root, tiny_model_dir)
