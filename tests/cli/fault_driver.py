"""Runs ``rlmap.cli.main`` on each case of a JSON file, in this process; prints the results.

Used by ``test_cli_faults.py`` inside a private mount namespace (where a read-only and
a full file system are mounted), so the tree hashes are taken here, before the
namespace and its mounts go away. Input: ``[{"argv": [...], "watch": [dirs]}, ...]``;
output (stdout, one JSON list): ``{"status", "err", "changed"}`` per case.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

from cli_workspace import tree_hash

from rlmap.cli import main


def run(cases: list[dict[str, list[str]]]) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for case in cases:
        watched = [Path(w) for w in case["watch"]]
        before = [tree_hash(w) for w in watched]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(case["argv"])
        changed = [str(w) for w, h in zip(watched, before, strict=True) if tree_hash(w) != h]
        results.append({"status": status, "err": err.getvalue(), "changed": changed})
    return results


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))))
