"""Tasks: one interface (:class:`rlmap.tasks.kind.TaskKind`) and one module per kind
(:mod:`rlmap.tasks.sources`), over the task implementations (arithmetic, calculator,
reasoning-gym, gymnasium, verifiers, data files), their environments and prompts."""
