"""One module per task kind, each building its :class:`rlmap.tasks.kind.TaskKind`."""
