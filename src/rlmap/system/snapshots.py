"""Finished trajectories as the asynchronous queue holds them, and as the plain values a
checkpoint keeps of the queue (:meth:`rlmap.system.async_loop.AsyncRunner.snapshot`).

Every trajectory has an id — its group, its place in the group (:attr:`Finished.uid`) — so
a resumed run consumes none twice and loses none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from rlmap.core.batch import End, RewardStatus
from rlmap.rollout.episodes import Episode
from rlmap.rollout.packing import Scored


@dataclass(frozen=True)
class Finished:
    """A scored trajectory as it leaves a worker."""

    scored: Scored
    duration_s: float
    """Wall seconds from the start of its prompt's rollout to its end."""
    index: int = 0
    """Its place in its group: (``scored.group``, ``index``) names it across the whole run."""

    @property
    def uid(self) -> tuple[int, int]:
        return self.scored.group, self.index

    def to_record(self) -> dict[str, Any]:
        """Plain values (a checkpoint loads with ``weights_only=True``)."""
        return {
            "scored": scored_record(self.scored),
            "duration_s": self.duration_s,
            "index": self.index,
        }

    @staticmethod
    def from_record(r: dict[str, Any]) -> Finished:
        return Finished(scored_from_record(r["scored"]), r["duration_s"], r["index"])


def scored_record(x: Scored) -> dict[str, Any]:
    """A scored trajectory as plain values: tuples as lists, enums as ints, routes a tensor."""
    top = {f.name: getattr(x, f.name) for f in fields(x) if f.name != "episode"}
    top |= {"status": int(x.status), "per_turn": None if x.per_turn is None else list(x.per_turn)}
    return top | {"episode": episode_record(x.episode)}


def episode_record(e: Episode) -> dict[str, Any]:
    """An episode as plain values, its segments (``data.context_policy``) each as one."""
    episode = {f.name: getattr(e, f.name) for f in fields(e)}
    episode |= {"end": int(e.end), "status": int(e.status)}
    episode["segments"] = [episode_record(x) for x in e.segments]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in episode.items()}


def episode_from_record(r: dict[str, Any]) -> Episode:
    """The inverse of :func:`episode_record`."""
    e: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}
    e |= {"end": End(e["end"]), "status": RewardStatus(e["status"])}
    e["segments"] = tuple(episode_from_record(x) for x in e.get("segments", ()))
    return Episode(**e)


def scored_from_record(r: dict[str, Any]) -> Scored:
    """The inverse of :func:`scored_record`."""
    top = {k: v for k, v in r.items() if k != "episode"}
    top |= {
        "status": RewardStatus(top["status"]),
        "per_turn": None if top["per_turn"] is None else tuple(top["per_turn"]),
    }
    return Scored(episode=episode_from_record(r["episode"]), **top)


SNAPSHOT_SHAPE: dict[str, Any] = {
    "queue": list,
    "redo": list,
    "lost": int,
    "started": int,
    "dropped": int,
    "cursor": int,
    "finished": int,
    "finished_tokens": int,
    "aborted_rounds": int,
    "consumed": int,
    "stale_dropped": int,
    "rejected": int,
    "restarted": int,
    "empty_steps": int,
    "taken": list,
    "rounds": int,
}
"""Every field of an :meth:`rlmap.system.async_loop.AsyncRunner.snapshot` and its type
(:func:`rlmap.experiments.checkpoint_load.shape_problem`): a checkpoint whose snapshot lacks one
is damaged."""


def snapshot_problem(r: dict[str, Any], where: str = "") -> str | None:
    """What does not load back in a snapshot that has every field of :data:`SNAPSHOT_SHAPE`
    (a queued trajectory; a round to redo or a group's taken mask that is not a pair of
    ints), named by its place; None when all does. A resume checks it before it touches
    the run, not when its runner starts."""
    for k, record in enumerate(r["queue"]):
        try:
            Finished.from_record(record)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return f"{where}queue[{k}]: not a finished trajectory ({type(exc).__name__}: {exc})"
    for name in ("redo", "taken"):
        for k, pair in enumerate(r[name]):
            if not (
                isinstance(pair, (list, tuple))
                and len(pair) == 2
                and all(isinstance(x, int) for x in pair)
            ):
                return f"{where}{name}[{k}]: expected a pair of ints, got {pair!r:.60}"
    return None


def numbered(scored: list[Scored], took: float) -> list[Finished]:
    """A round's trajectories, each numbered within its group in the order they came."""
    seen: dict[int, int] = {}
    out = []
    for x in scored:
        index = seen.get(x.group, 0)
        seen[x.group] = index + 1
        out.append(Finished(x, took, index))
    return out
