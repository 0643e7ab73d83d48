"""Inputs of :mod:`rlmap.simulator.model`: duration distributions and a run's measured times.

A distribution is written ``NAME:P1,P2,...`` (the ``--duration`` and ``--learner-step-s``
flags of ``rlmap simulate``); a bare number means ``fixed``:

| spec | draws | mean |
|---|---|---|
| ``fixed:v`` (or ``v``) | always v | v |
| ``exponential:m`` | Exp with mean m | m |
| ``lognormal:mu,sigma`` | exp(mu + sigma·Z), Z ~ N(0, 1) | exp(mu + sigma²/2) |
| ``pareto:alpha,scale`` | scale · U^(−1/alpha) ≥ scale | alpha·scale/(alpha − 1) (alpha > 1) |
| ``empirical:v1,v2,...`` | i.i.d. resampling of the values | their mean |
| ``trace:v1,v2,...`` | the values in order, cycling (replays a measured sequence) | their mean |

Every distribution yields a stream of draws from one seeded ``random.Random``; the
i-th draw of a stream is the same whatever the simulated mode does between draws,
so sync, async and partial runs with one seed see the same durations in the same
order (common random numbers: their differences are the modes', not the dice's).

:func:`profile_from_run` reads a run directory's ``metrics.jsonl``; see its docstring
for which metrics it uses and how it fits a lognormal to percentiles.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlmap.core.errors import ConfigError, InputError

Z95 = 1.6448536269514722
"""Φ⁻¹(0.95): the 95th percentile of N(0, 1), used to fit a lognormal to p50 and p95."""


class Duration(Protocol):
    """A distribution of durations in seconds."""

    @property
    def spec(self) -> str:
        """``NAME:params`` as :func:`parse_duration` reads it (long value lists abbreviated)."""
        ...

    @property
    def mean(self) -> float:
        """Expected value (``math.inf`` for a Pareto tail with alpha ≤ 1)."""
        ...

    def stream(self, rng: random.Random) -> Iterator[float]:
        """An endless iterator of draws, using only ``rng``."""
        ...


@dataclass(frozen=True)
class Fixed:
    """Always ``value`` seconds."""

    value: float

    @property
    def spec(self) -> str:
        return f"fixed:{self.value:g}"

    @property
    def mean(self) -> float:
        return self.value

    def stream(self, rng: random.Random) -> Iterator[float]:
        return itertools.repeat(self.value)


@dataclass(frozen=True)
class Exponential:
    """Exponential with the given mean (memoryless; coefficient of variation 1)."""

    mean_s: float

    @property
    def spec(self) -> str:
        return f"exponential:{self.mean_s:g}"

    @property
    def mean(self) -> float:
        return self.mean_s

    def stream(self, rng: random.Random) -> Iterator[float]:
        rate = 1.0 / self.mean_s
        while True:
            yield rng.expovariate(rate)


@dataclass(frozen=True)
class LogNormal:
    """exp(mu + sigma·Z): median exp(mu), p95 exp(mu + 1.645·sigma)."""

    mu: float
    sigma: float

    @property
    def spec(self) -> str:
        return f"lognormal:{self.mu:g},{self.sigma:g}"

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)

    def stream(self, rng: random.Random) -> Iterator[float]:
        while True:
            yield rng.lognormvariate(self.mu, self.sigma)


@dataclass(frozen=True)
class Pareto:
    """Pareto type I: P(X > x) = (scale/x)^alpha for x ≥ scale. alpha ≤ 2: infinite variance."""

    alpha: float
    scale: float

    @property
    def spec(self) -> str:
        return f"pareto:{self.alpha:g},{self.scale:g}"

    @property
    def mean(self) -> float:
        return self.alpha * self.scale / (self.alpha - 1) if self.alpha > 1 else math.inf

    def stream(self, rng: random.Random) -> Iterator[float]:
        while True:
            yield self.scale * rng.paretovariate(self.alpha)


@dataclass(frozen=True)
class Empirical:
    """I.i.d. resampling (with replacement) of measured durations."""

    values: tuple[float, ...]

    @property
    def spec(self) -> str:
        return "empirical:" + _list_spec(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    def stream(self, rng: random.Random) -> Iterator[float]:
        values = self.values
        while True:
            yield values[rng.randrange(len(values))]


@dataclass(frozen=True)
class Trace:
    """The values in their order, cycling: replays a measured sequence, no randomness."""

    values: tuple[float, ...]

    @property
    def spec(self) -> str:
        return "trace:" + _list_spec(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    def stream(self, rng: random.Random) -> Iterator[float]:
        return itertools.cycle(self.values)


def _list_spec(values: Sequence[float], shown: int = 6) -> str:
    if len(values) <= shown:
        return ",".join(f"{v:g}" for v in values)
    head = ",".join(f"{v:g}" for v in values[:shown])
    return f"{head},... ({len(values)} values, mean {statistics.fmean(values):.4g})"


def _positive(flag: str, name: str, value: float) -> float:
    if not value > 0 or math.isinf(value):
        raise ConfigError(f"{flag}: {name} must be a positive finite number, got {value:g}")
    return value


def _finite(flag: str, name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ConfigError(f"{flag}: {name} must be a finite number, got {value:g}")
    return value


def _values(flag: str, params: Sequence[float]) -> tuple[float, ...]:
    if not params:
        raise ConfigError(f"{flag}: needs at least one value")
    return tuple(_positive(flag, "every value", v) for v in params)


# name → (parameter names, or None for a list; constructor checking its parameters)
_PARSERS: dict[str, tuple[tuple[str, ...] | None, Callable[[str, Sequence[float]], Duration]]] = {
    "fixed": (("value",), lambda f, p: Fixed(_positive(f, "value", p[0]))),
    "exponential": (("mean",), lambda f, p: Exponential(_positive(f, "mean", p[0]))),
    "lognormal": (
        ("mu", "sigma"),
        lambda f, p: LogNormal(_finite(f, "mu", p[0]), _nonnegative(f, "sigma", p[1])),
    ),
    "pareto": (
        ("alpha", "scale"),
        lambda f, p: Pareto(_positive(f, "alpha", p[0]), _positive(f, "scale", p[1])),
    ),
    "empirical": (None, lambda f, p: Empirical(_values(f, p))),
    "trace": (None, lambda f, p: Trace(_values(f, p))),
}


def _nonnegative(flag: str, name: str, value: float) -> float:
    if not value >= 0 or math.isinf(value):
        raise ConfigError(f"{flag}: {name} must be a finite number >= 0, got {value:g}")
    return value


def parse_duration(text: str, flag: str = "--duration") -> Duration:
    """``NAME:P1,P2`` (or a bare number: fixed) → a distribution; errors name ``flag``."""
    name, _, rest = text.strip().partition(":")
    if not rest and _is_number(name):
        name, rest = "fixed", name
    if name not in _PARSERS:
        known = ", ".join(
            f"{n}:{','.join(a) if a else 'v1,v2,...'}" for n, (a, _) in _PARSERS.items()
        )
        raise ConfigError(f"{flag}: unknown distribution {name!r} (known: {known})")
    arity, build = _PARSERS[name]
    try:
        params = [float(p) for p in rest.split(",")] if rest else []
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} has a parameter that is not a number") from None
    if arity is not None and len(params) != len(arity):
        raise ConfigError(f"{flag}: {name} takes {','.join(arity)}, got {text!r}")
    return build(flag, params)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_learner_step(text: str, flag: str = "--learner-step-s") -> Duration:
    """Like :func:`parse_duration`, but a bare ``0`` is allowed: an instantaneous learner."""
    name, _, rest = text.strip().partition(":")
    number = rest if name == "fixed" else text
    if _is_number(number) and float(number) == 0:
        return Fixed(0.0)
    return parse_duration(text, flag)


def lognormal_from_median_and_mean(p50: float, mean: float) -> LogNormal:
    """The lognormal with this median and mean: ``mu = ln p50``, ``sigma = √(2 ln(mean/p50))``
    (mean = exp(mu + sigma²/2)); a mean at or below the median gives sigma = 0.

    Throughput with independent workers goes as 1 / mean duration, so matching the mean
    keeps a heavy tail's cost that a fit through p50 and p95 would miss."""
    _positive("p50", "p50", p50)
    _positive("mean", "mean", mean)
    return LogNormal(math.log(p50), math.sqrt(2.0 * max(0.0, math.log(mean / p50))))


def lognormal_from_percentiles(p50: float, p95: float) -> LogNormal:
    """The lognormal with this median and 95th percentile.

    ``mu = ln p50``, ``sigma = (ln p95 − ln p50) / Φ⁻¹(0.95)``; p95 ≤ p50 gives sigma = 0
    (a fixed duration): a lognormal cannot have a p95 below its median.
    """
    _positive("p50", "p50", p50)
    _positive("p95", "p95", p95)
    return LogNormal(math.log(p50), max(0.0, (math.log(p95) - math.log(p50)) / Z95))


@dataclass(frozen=True)
class RunProfile:
    """What a run's ``metrics.jsonl`` says about its rollout and learner times."""

    duration: Duration
    """Per-trajectory rollout duration."""
    learner_step: Duration | None
    """Learner step time (``system/update_s``), or ``None`` when the run does not log it."""
    batch: int | None
    """Trajectories per learner step (median ``sampling/generated``), when logged."""
    source: str
    """Which metrics were used, in words."""
    workers: int | None = None
    """Asynchronous runs: the run's rollout workers (``system.workers`` in its config)."""
    round_size: int = 1
    """Asynchronous runs: trajectories a worker rolls out together (one batched ``generate``
    per turn); the simulator models such a round as one trajectory."""
    mode: str | None = None
    """The run's ``system.mode`` (``async`` or ``sync``), when its config says."""
    eta: int | None = None
    """Asynchronous runs: the run's staleness bound η (``behaviour.max_staleness``)."""
    partial_rollout: bool = False
    """Asynchronous runs with ``system.partial_rollout``."""


def profile_from_run(run_dir: Path) -> RunProfile:
    """Rollout and learner times of a run, from its ``metrics.jsonl``, best source first.

    1. ``system/rollout_durations`` (a list of per-trajectory seconds in a step's record):
       all of them, pooled, as an ``empirical`` distribution.
    2. ``system/rollout_duration_p50`` and ``_mean`` (the asynchronous loop logs both): the
       lognormal with the median of the p50s and the mean of the means
       (:func:`lognormal_from_median_and_mean`), which keeps the tail's cost in throughput.
    3. ``system/rollout_duration_p50`` and ``_p95`` (per-step percentiles): the medians of
       each over the steps, and the lognormal through them (:func:`lognormal_from_percentiles`).
       Pooling steps by the median of their percentiles ignores drift of the
       distribution during the run; a lognormal has a lighter tail than a Pareto, so
       a run whose p99/p95 is far above the lognormal's (exp(0.681·sigma)) is fitted
       too optimistically.
    4. Only ``system/rollout_s`` (the synchronous embedded loop: one batched ``generate``
       call per step, so every trajectory of a step lasts that step's rollout time):
       a ``trace`` of the per-step rollout times, each repeated ``batch`` times, to be
       replayed with workers = batch in ``sync`` mode. Per-trajectory durations
       inside a batched call are not observable; this profile cannot predict async.

    ``learner_step`` is a ``trace`` (case 4) or ``empirical`` (cases 1–3) of ``system/update_s``.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"--from-run: {path} does not exist")
    from rlmap.runs.rundir import MetricsLog

    records = MetricsLog.read(path)  # InputError naming path:lineno for a bad line
    steps = [r for r in records if any(str(k).startswith("system/") for k in r)]
    update = _series(steps, "system/update_s")
    generated = _series(steps, "sampling/generated")
    batch = round(statistics.median(generated)) if generated else None
    found = _rollout_duration(steps)
    if found is None and _series(steps, "system/rollout_s") and batch:
        return _batched_sync_profile(steps, update, batch)
    if found is None:
        raise ConfigError(
            f"--from-run: {path} logs no rollout durations (system/rollout_durations, "
            "system/rollout_duration_p50/p95 or system/rollout_s)"
        )
    duration, source = found
    learner = Empirical(tuple(update)) if update else None
    layout, system = async_layout(run_dir), run_system(run_dir)
    if layout is not None and batch:
        workers, size = layout
        return RunProfile(duration, learner, max(1, batch // size), source, workers, size, *system)
    return RunProfile(duration, learner, batch, source, None, 1, *system)


def _rollout_duration(steps: Sequence[dict[str, object]]) -> tuple[Duration, str] | None:
    """The rollout duration distribution of cases 1–3 of :func:`profile_from_run`, and where
    it comes from; None when the steps log none of their metrics."""
    durations = [
        float(v)
        for r in steps
        if isinstance(listed := r.get("system/rollout_durations"), list)
        for v in listed
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    p50, p95 = (
        _series(steps, "system/rollout_duration_p50"),
        _series(steps, "system/rollout_duration_p95"),
    )
    means = _series(steps, "system/rollout_duration_mean")
    if durations:
        duration: Duration = Empirical(_values("--from-run", durations))
        source = f"{len(durations)} per-trajectory durations (system/rollout_durations)"
    elif p50 and means:
        duration = lognormal_from_median_and_mean(statistics.median(p50), statistics.mean(means))
        source = f"lognormal through the median p50 and the mean duration over {len(p50)} steps"
    elif p50 and p95:
        duration = lognormal_from_percentiles(statistics.median(p50), statistics.median(p95))
        source = f"lognormal fitted to the median over {len(p50)} steps of rollout p50 and p95"
    else:
        return None
    return duration, source


def _batched_sync_profile(
    steps: Sequence[dict[str, object]], update: list[float], batch: int
) -> RunProfile:
    """Case 4 of :func:`profile_from_run`: a trace of the steps' ``system/rollout_s``, each
    repeated ``batch`` times, and a trace of their ``system/update_s``."""
    rollout = _series(steps, "system/rollout_s")
    duration = Trace(_values("--from-run", [s for s in rollout for _ in range(batch)]))
    source = f"batched sync run: {len(rollout)} steps' system/rollout_s, each x{batch}"
    return RunProfile(duration, Trace(tuple(update)) if update else None, batch, source)


def run_system(run_dir: Path) -> tuple[str | None, int | None, bool]:
    """(mode, η, partial rollout) of a run from its ``config.yaml``; (None, None, False)
    without one. η is given for asynchronous runs only."""
    from rlmap.runs.rundir import read_yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None, None, False
    cfg = read_yaml(path)
    system, behaviour = cfg.get("system") or {}, cfg.get("behaviour") or {}
    if not isinstance(system, dict) or not isinstance(behaviour, dict):
        raise InputError(f"{path}: unreadable system/behaviour settings")
    mode = str(system.get("mode", "sync"))
    if mode != "async":
        return mode, None, False
    try:
        eta = int(behaviour.get("max_staleness", 4))
    except (TypeError, ValueError):
        raise InputError(f"{path}: behaviour.max_staleness is not an integer") from None
    return mode, eta, bool(system.get("partial_rollout", False))


def async_layout(run_dir: Path) -> tuple[int, int] | None:
    """(workers, trajectories per worker round) of an asynchronous run, from its
    ``config.yaml``; None for a synchronous run or one without a config."""
    from rlmap.runs.rundir import read_yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    cfg = read_yaml(path)  # InputError naming the file when it is not a YAML mapping
    system, sampling = cfg.get("system"), cfg.get("sampling") or {}
    if not isinstance(system, dict) or system.get("mode") != "async":
        return None
    try:
        workers = int(system.get("workers", 2))
        per_step = int(sampling["prompts_per_step"])
        prompts = system.get("worker_prompts") or max(1, per_step // workers)
        return workers, int(prompts) * int(sampling.get("group_size", 1))
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        raise InputError(f"{path}: unreadable system/sampling settings of an async run") from None


def _series(records: Sequence[dict[str, object]], key: str) -> list[float]:
    return [float(v) for r in records if isinstance(v := r.get(key), (int, float))]
