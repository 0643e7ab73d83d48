"""Errors that reach the user as one line naming the field or component at fault."""


class ConfigError(ValueError):
    """An invalid value or combination in a run's configuration.

    The message is one line and starts with the dotted field name, e.g.
    ``sampling.group_size: estimator 'grpo' needs a group of G >= 2, got 1``.
    """


class UnknownComponentError(ConfigError, KeyError):
    """A component name that is not in its axis registry."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class InputError(ValueError):
    """Bad input that is not a config field: a file, a row of a file, a path, a directory.

    The message is one line and starts with what is at fault, e.g.
    ``data/train.jsonl: row 17: 'answer' is missing`` or
    ``runs/x: not a run directory (no metrics.jsonl)``.
    """


class TrainingError(RuntimeError):
    """Training cannot go on without corrupting the run (a non-finite loss, gradient or
    weight). One line naming the step; nothing non-finite is ever written as a checkpoint.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none): what a
    one-line error quotes of a library's own."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
