"""The task kinds ``data.task`` can name: :func:`task_kinds` registers one
:class:`~rlmap.tasks.kind.TaskKind` per module of :mod:`rlmap.tasks.sources`, and
:func:`kind_of` answers which one a ``data.task`` value names. Nothing outside the task
package branches on a task's kind: it asks :func:`kind_of` (a test greps for it).

Adding a kind: a module that builds a :class:`~rlmap.tasks.kind.TaskKind`, and one line in
:func:`task_kinds`. A test registers its own with ``task_kinds(extra=...)`` and puts it in
place of :func:`kinds` for the test's duration (``monkeypatch``).
"""

from __future__ import annotations

import functools

from rlmap.core.registry import Registry
from rlmap.tasks.kind import TaskKind


def task_kinds(extra: tuple[TaskKind, ...] = ()) -> Registry[TaskKind]:
    """The built-in kinds, in ``rlmap tasks``'s order, then ``extra``."""
    from rlmap.tasks.sources import builtin, files, gym, kv_recall, reasoning_gym, verifiers

    out: Registry[TaskKind] = Registry("task kind")
    for kind in (
        builtin.ARITHMETIC,
        builtin.CALCULATOR,
        files.FILES,
        gym.GYM,
        verifiers.VERIFIERS,
        reasoning_gym.REASONING_GYM,
        kv_recall.KV_RECALL,
        *extra,
    ):
        out.add(kind.name, kind)
    return out


@functools.cache
def kinds() -> Registry[TaskKind]:
    """The kinds :func:`kind_of` reads: :func:`task_kinds`, built on first use (importing this
    module imports no kind's module)."""
    return task_kinds()


def kind_of(task: str) -> TaskKind:
    """The kind of a ``data.task`` value: the first that matches, else the fallback."""
    registered = kinds()
    found = [registered.get(name) for name in registered]
    for kind in found:
        if not kind.fallback and kind.matches(task):
            return kind
    return next(kind for kind in found if kind.fallback)
