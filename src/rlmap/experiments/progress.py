"""What a person watching the console sees: progress bars with the numbers that matter.

On a terminal: a rich progress bar (step, reward, held-out pass@1, tokens/s, ETA).
Elsewhere (CI, a log file): one plain line per evaluation, so logs stay readable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressView:
    """Console progress for the warm start and the training loop."""

    def __init__(self, *, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._bar: Progress | None = None
        self._task: Any = None
        self._pass1: float | None = None

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )

    def phase(self, label: str) -> Callable[[int, int, float], None]:
        """A progress callback ``(step, total, loss)`` for a set-up phase (warm start, RM)."""

        def show(step: int, total: int, loss: float) -> None:
            if not self.enabled:
                return
            if not self.console.is_terminal:
                if step == 1 or step == total or step % 100 == 0:
                    self.console.print(f"{label} {step}/{total} loss {loss:.3f}")
                return
            if self._bar is None:
                self._bar = self._progress()
                self._bar.start()
                self._task = self._bar.add_task(label, total=total, info="")
            self._bar.update(self._task, completed=step, info=f"loss {loss:.3f}")
            if step == total:
                self._bar.stop()
                self._bar = None

        return show

    def warm_start(self, step: int, total: int, loss: float) -> None:
        """Progress callback of the warm start (SFT), called after each of its steps."""
        self.phase("warm start")(step, total, loss)

    @contextmanager
    def training(self, total: int, start: int) -> Iterator[None]:
        """The training bar, open for the duration of the loop."""
        if self.enabled and self.console.is_terminal:
            self._bar = self._progress()
            self._task = self._bar.add_task("train", total=total, completed=start, info="")
            with self._bar:
                yield
            self._bar = None
        else:
            yield

    def step(self, step: int, metrics: dict[str, float], ledger: Any) -> None:
        """Show one finished step."""
        if not self.enabled:
            return
        self._pass1 = metrics.get("eval/pass@1", self._pass1)
        pass1 = "-" if self._pass1 is None else f"{self._pass1:.3f}"
        info = (
            f"reward {metrics.get('reward/mean', float('nan')):.3f}  held-out pass@1 {pass1}  "
            f"{metrics.get('system/tokens_per_s', 0.0):.0f} tok/s"
        )
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif "eval/pass@1" in metrics:
            self.console.print(f"step {step}  {info}  tokens {ledger.generated_tokens}")
