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
