"""AI judges over an OpenAI-compatible HTTP endpoint, and rewards from comparisons.

Two rewards, both :class:`rlmap.feedback.reward.Reward` s (so the trainer calls them
through ``score_batch`` like any other):

- :class:`PointwiseJudge` (``feedback.source=judge``): one request per trajectory; the
  reply's rating (:func:`parse_score`), in [lo, hi] = [``feedback.judge_min``,
  ``feedback.judge_max``], gives the reward (rating − lo) / (hi − lo) ∈ [0, 1].
- :class:`ComparisonReward` (``feedback.source=comparison``): within each group of G
  responses to one prompt, pairwise verdicts ("A", "B" or a tie: :func:`parse_choice`;
  two identical responses are a tie, never asked) on a connected design of pairs
  (:func:`pair_design`: all G(G−1)/2, or K of them), each pair shown in a seeded random
  order; the verdicts become per-response rewards, the win rate (ties ½) or the
  Bradley–Terry strength σ(s_i − s̄) fitted per group (:func:`bt_rewards`).

Failures are statuses, never zeros (``docs/rewards.md``): a reply with no parsable
verdict is ``INVALID``; a refused connection, an HTTP error or a malformed body is
``INFRA_ERROR``, a request that outlived ``feedback.judge_timeout_s`` ``TIMEOUT`` (a
deadline for the whole request, not for each socket read: :func:`read_within`), after
``feedback.judge_retries`` retries with exponential backoff. A response whose every
comparison failed takes the most severe of their statuses; one with some verdicts is
scored on those.

The client (:class:`JudgeClient`) sends at most ``feedback.judge_concurrency`` requests
at once (threads: one blocking ``urllib`` call each), and caches replies by a hash of the
request body, so a repeated (prompt, response) pair costs nothing. Each request's usage
(prompt and completion tokens) is counted; :class:`JudgeStats` turns the counts and the
bias probes into the ``judge/*`` metrics of a step:

- ``judge/position_agreement``: of the pairs shown in both orders (a fraction
  ``feedback.judge_position_check`` of them), the share whose two verdicts name the same
  response. A judge that always prefers the first shown scores 0.
- ``judge/first_preferred_frac``: the share of pairwise verdicts (ties aside) that
  preferred the first response shown (0.5 for a judge without position bias, since
  orders are random). Pairs of identical responses are ties, never asked.
- ``judge/length_corr``: the correlation between the judge's score and the response's
  length among responses to the same prompt with equal verifier outcome (pooled
  within-stratum Pearson: both centred within each stratum, then correlated), so a judge
  that rewards length, not correctness, shows up even when correct answers are longer.
- ``judge/pairs``: pairwise verdicts of the step, asked or (identical responses) tied.
- ``judge/self_consistency``: of the requests sent twice (a fraction
  ``feedback.judge_repeat_check``, the repeat bypassing the cache), the share whose two
  verdicts agree.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import math
import os
import random
import re
import socket
import string
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.feedback.params import FeedbackParams
from rlmap.feedback.reward import Score, Trajectory, on_last_turn, score_batch, worst

POINTWISE_TEMPLATE = """\
Rate the response to the task below for correctness, from {lo} (wrong) to {hi} (correct).
Reply with the number only.

Task:
{prompt}

Response:
{response}

Rating:"""

PAIRWISE_TEMPLATE = """\
Which response answers the task below correctly? Reply with A or B only, or TIE if they
are equally good.

Task:
{prompt}

Response A:
{first}

Response B:
{second}

Better response:"""

EMBEDDED_POINTWISE = "{response}?{prompt}"
"""The embedded judge's pointwise template (``feedback.judge_template=embedded``):
``19?12+7=``, answered with its own sum, then ``1`` or ``0`` (``19:1``;
:mod:`rlmap.learned.judge_model`)."""
EMBEDDED_PAIRWISE = "{first},{second}?{prompt}"
"""... and its pairwise one: ``18,19?12+7=``, answered ``19:b``."""

FIELDS = {
    "pointwise": ({"prompt", "response", "reference", "lo", "hi"}, {"response"}),
    "pairwise": ({"prompt", "first", "second", "reference"}, {"first", "second"}),
}
"""Per mode: the placeholders a template may use, and those it must use."""

CACHE_SIZE = 100_000
"""Replies kept in a client's cache (a few MB), the oldest dropped first."""
BACKOFF_S = 0.25
"""The first retry's wait; each later one waits twice as long."""

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_LETTER = re.compile(r"\b([AB])\b")
_KEYWORD = re.compile(r"(?i)\b(?:rating|score)\b[^\w+-]*(" + _NUMBER.pattern + ")")
_LEADING = re.compile("(" + _NUMBER.pattern + r")(?=$|[\s.,;:!)/]|out\b)")
_RANGE = re.compile(r"\d+(?:\.\d+)?\s*(?:-|–|\bto\b)\s*\d+(?:\.\d+)?")
_EMBEDDED_REPLY = re.compile(r"-?\d*:(\d)")
_LAST_LETTER = re.compile(r"(?:^|[:,]\s*)([ABab])[.!]?$")
_TIE = re.compile(r"(?i)\W*(?:it'?s\s+)?(?:a\s+)?(?:tie|equal(?:ly good)?)\b")


def load_template(path: str | None, mode: Literal["pointwise", "pairwise"]) -> str:
    """The prompt template of ``mode``: the file at ``path``, the built-in one (None), or the
    embedded judge's short one (``embedded``).

    A template is ``str.format`` text; it may use only the mode's placeholders and must use
    the ones that carry the responses. Errors are one line naming ``feedback.judge_template``.
    """
    if path is None:
        return POINTWISE_TEMPLATE if mode == "pointwise" else PAIRWISE_TEMPLATE
    if path == "embedded":
        return EMBEDDED_POINTWISE if mode == "pointwise" else EMBEDDED_PAIRWISE
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"feedback.judge_template: cannot read {path} ({exc.strerror})") from None
    allowed, required = FIELDS[mode]
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"feedback.judge_template: {path}: {exc}") from None
    unknown, missing = sorted(names - allowed), sorted(required - names)
    if unknown or missing:
        what = (f"unknown placeholder(s) {unknown}" if unknown else "") + (
            "; " if unknown and missing else "") + (
            f"missing {missing}" if missing else "")  # fmt: skip
        raise ConfigError(f"feedback.judge_template: {path}: {what} (a {mode} template may use "
                          f"{sorted(allowed)})")  # fmt: skip
    return text


# --- parsing -----------------------------------------------------------------------------


def parse_score(reply: str, lo: float, hi: float) -> float | None:
    """The reply's rating mapped from [lo, hi] to [0, 1]; None if there is none, or it lies
    outside the range (an unparseable reply: ``INVALID``). Ranges ("0-10", "1 to 10") are
    never ratings. The rating is, in this order: the verdict of the embedded judge's
    ``SUM:VERDICT`` ("19:1"); the number after "rating" or "score" ("Rating (0-10): 7",
    "Score: -2"); the number the reply starts with ("7/10", "8 out of 10", "7. The answer
    is right but step 3 is unclear"); the last ("I would rate it 7 on a scale of 0 to 10")."""
    text = reply.strip()
    embedded = _EMBEDDED_REPLY.fullmatch(text)
    if embedded is not None:
        return _in_range(float(embedded.group(1)), lo, hi)
    text = _RANGE.sub(" ", text)
    found = _KEYWORD.search(text) or _LEADING.match(text)
    if found is not None:
        value = float(found.group(1))
    else:
        numbers = _NUMBER.findall(text)
        if not numbers:
            return None
        value = float(numbers[-1])
    return _in_range(value, lo, hi)


def _in_range(value: float, lo: float, hi: float) -> float | None:
    if not lo <= value <= hi:
        return None
    return (value - lo) / (hi - lo)


def parse_choice(reply: str) -> float | None:
    """0 if the reply picks A (the first shown), 1 for B, ½ for a tie (a reply that starts
    "tie", "it's a tie", "equal"), None if it names neither or both. A reply that is one
    letter, ``a`` or ``b`` in either case, picks it; one that names both picks only the
    letter it leads with, alone or followed by punctuation ("A, because B is wrong"; not
    "A better answer is B"); one that names neither picks a lone letter that ends it after
    ":" or "," (the embedded judge's "19:b")."""
    text = reply.strip()
    alone = text.rstrip(".!").upper()
    if alone in ("A", "B"):
        return float("AB".index(alone))
    if _TIE.match(text):  # "TIE", "It's a tie", "Equally good: both are right"
        return 0.5
    letters = set(_LETTER.findall(text))
    if len(letters) == 1:
        return 0.0 if letters == {"A"} else 1.0
    first = re.match(r"\W*([AB])\s*(?:[,.:;)!]|$)", text)
    if first is None and not letters:  # "19:b": a lowercase letter alone at the end
        first = _LAST_LETTER.search(text)
    return None if first is None else float("AB".index(first.group(1).upper()))


# --- the client --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One request's outcome: the reply text, or why there is none."""

    text: str | None
    status: RewardStatus = RewardStatus.OK
    reason: str = ""


@dataclass
class JudgeStats:
    """What the judge did since the last :meth:`drain`: counts, and the bias probes'
    observations (thread-safe: asynchronous workers score concurrently)."""

    calls: int = 0
    cache_hits: int = 0
    failed: int = 0
    invalid: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    pairs: int = 0
    first_preferred: list[bool] = field(default_factory=list)
    position: list[bool] = field(default_factory=list)
    repeats: list[bool] = field(default_factory=list)
    scored: list[tuple[float, float, Hashable]] = field(default_factory=list)
    """(judge's score, length, stratum: prompt and verifier outcome) of each scored response."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def drain(self) -> dict[str, float]:
        """The ``judge/*`` metrics of what happened since the last drain (module docstring);
        a probe with no observation is left out, not logged as 0."""
        with self.lock:
            out = {
                "judge/calls": float(self.calls),
                "judge/cache_hits": float(self.cache_hits),
                "judge/failed": float(self.failed),
                "judge/invalid": float(self.invalid),
                "judge/prompt_tokens": float(self.prompt_tokens),
                "judge/completion_tokens": float(self.completion_tokens),
                "judge/pairs": float(self.pairs),
            }
            for name, seen in (("first_preferred_frac", self.first_preferred),
                               ("position_agreement", self.position),
                               ("self_consistency", self.repeats)):  # fmt: skip
                if seen:
                    out[f"judge/{name}"] = sum(seen) / len(seen)
            corr = within_outcome_corr(self.scored)
            if corr is not None:
                out["judge/length_corr"] = corr
            fresh = JudgeStats()
            for f in ("calls", "cache_hits", "failed", "invalid", "prompt_tokens",
                      "completion_tokens", "pairs", "first_preferred", "position", "repeats",
                      "scored"):  # fmt: skip
                setattr(self, f, getattr(fresh, f))
        return out


def within_outcome_corr(rows: Sequence[tuple[float, float, Hashable]]) -> float | None:
    """Pearson's correlation of score and length after centring both within each stratum
    (the pooled within-group correlation); None when either has no spread left."""
    if len(rows) < 3:
        return None
    by: dict[Hashable, list[tuple[float, float]]] = {}
    for score, length, outcome in rows:
        by.setdefault(outcome, []).append((score, length))
    xs: list[float] = []
    ys: list[float] = []
    for group in by.values():
        ms = sum(s for s, _ in group) / len(group)
        ml = sum(n for _, n in group) / len(group)
        xs += [s - ms for s, _ in group]
        ys += [n - ml for _, n in group]
    sxx, syy = sum(x * x for x in xs), sum(y * y for y in ys)
    if sxx < 1e-12 or syy < 1e-12:
        return None
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / math.sqrt(sxx * syy)


@dataclass
class JudgeClient:
    """Chat completions at ``url`` (``…/v1``): concurrent, retried, cached (module docstring).

    At most ``concurrency`` requests are in flight at once over every caller (asynchronous
    workers, the evaluation: one semaphore, which a :func:`dataclasses.replace` copy
    shares). The cache keeps the newest CACHE_SIZE replies; a prompt asked twice in one
    call is sent once (the copy counts as a cache hit, or as a failure when the request
    failed: ``judge/failed`` counts prompts left without a reply). ``api_key`` goes as a
    bearer token.
    """

    url: str
    model: str
    timeout_s: float = 30.0
    retries: int = 2
    concurrency: int = 8
    max_tokens: int = 16
    temperature: float = 0.0
    api_key: str | None = field(default=None, repr=False)
    stats: JudgeStats = field(default_factory=JudgeStats)
    cache: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    slots: threading.BoundedSemaphore | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.slots is None:
            self.slots = threading.BoundedSemaphore(self.concurrency)

    def ask(self, prompts: Sequence[str], *, fresh: Sequence[bool] = ()) -> list[Reply]:
        """One reply per prompt, in order; ``fresh[i]`` bypasses the cache (a repeat)."""
        fresh = list(fresh) or [False] * len(prompts)
        if not prompts:
            return []
        jobs: list[tuple[str, bool]] = []
        where: list[int] = []  # prompt i → its job
        copies: list[int] = []  # the jobs of prompts that repeat an earlier one's
        first: dict[str, int] = {}
        for prompt, again in zip(prompts, fresh, strict=True):
            if not again and prompt in first:
                where.append(first[prompt])
                copies.append(first[prompt])
                continue
            if not again:
                first[prompt] = len(jobs)
            where.append(len(jobs))
            jobs.append((prompt, again))
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(jobs)),
                                thread_name_prefix="rlmap-judge") as pool:  # fmt: skip
            replies = list(pool.map(lambda job: self._one(*job), jobs))
        with self.stats.lock:  # a copy shares its reply: a hit, or a failure like it
            self.stats.cache_hits += sum(replies[k].text is not None for k in copies)
            self.stats.failed += sum(replies[k].text is None for k in copies)
        return [replies[k] for k in where]

    def _one(self, prompt: str, fresh: bool) -> Reply:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": self.max_tokens, "temperature": self.temperature},
                          sort_keys=True).encode()  # fmt: skip
        key = hashlib.sha256(body).hexdigest()
        if not fresh:
            with self.lock:
                cached = self.cache.get(key)
            if cached is not None:
                with self.stats.lock:
                    self.stats.cache_hits += 1
                return Reply(cached)
        assert self.slots is not None  # made in __post_init__
        with self.slots:
            reply = self._post(body)
        if reply.text is not None:
            with self.lock:
                self.cache[key] = reply.text
                if len(self.cache) > CACHE_SIZE:  # dicts keep insertion order: the oldest
                    del self.cache[next(iter(self.cache))]
        return reply

    def _post(self, body: bytes) -> Reply:
        request = urllib.request.Request(self.url.rstrip("/") + "/chat/completions", data=body,
                                         headers=_headers(self.api_key))  # fmt: skip
        failure = Reply(None, RewardStatus.INFRA_ERROR, "judge: no attempt")
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            with self.stats.lock:
                self.stats.calls += 1
            try:
                payload = json.loads(read_within(request, self.timeout_s))
                text = payload["choices"][0]["message"]["content"]
                if not isinstance(text, str):
                    raise ValueError("the message has no text content")
                usage = payload.get("usage") or {}
                tokens = (
                    int(usage.get("prompt_tokens") or 0),
                    int(usage.get("completion_tokens") or 0),
                )
            except urllib.error.HTTPError as exc:
                failure = Reply(None, RewardStatus.INFRA_ERROR, f"judge: HTTP {exc.code}")
                if exc.code < 500 and exc.code != 429:  # the request itself is refused
                    break
                continue
            except TimeoutError:
                failure = Reply(
                    None, RewardStatus.TIMEOUT, f"judge: no whole reply in {self.timeout_s} s"
                )
                continue
            except urllib.error.URLError as exc:
                timed_out = isinstance(exc.reason, TimeoutError)
                status = RewardStatus.TIMEOUT if timed_out else RewardStatus.INFRA_ERROR
                failure = Reply(None, status, f"judge: {exc.reason}")
                continue
            except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError,
                    TypeError, AttributeError) as exc:  # fmt: skip
                failure = Reply(None, RewardStatus.INFRA_ERROR,
                                f"judge: bad reply ({type(exc).__name__}: {exc})")  # fmt: skip
                continue
            with self.stats.lock:
                self.stats.prompt_tokens += tokens[0]
                self.stats.completion_tokens += tokens[1]
            return Reply(text)
        with self.stats.lock:
            self.stats.failed += 1
        return failure


def read_within(request: urllib.request.Request, timeout_s: float) -> bytes:
    """The body of the reply to ``request``, the whole exchange — connecting, sending, the
    status line, the headers and the body — ended within ``timeout_s`` seconds, else
    TimeoutError. ``urlopen``'s timeout bounds each socket operation alone: a server that
    sends one byte every 0.5 s held a request open for ever. Still bounded per operation
    only: the host's name lookup and a TLS handshake. HTTP errors and refusals are raised
    as ``urlopen`` raises them (proxies and redirects too are urllib's)."""
    with _opener(time.monotonic() + timeout_s).open(request, timeout=timeout_s) as r:
        return bytes(r.read())


def _left(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic()``); TimeoutError when none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out: the judge's deadline passed")
    return left


class _ReadBy(io.RawIOBase):
    """A socket's reads, each allowed only the time left until ``deadline``."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.raw, self.sock, self.deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self.sock.settimeout(_left(self.deadline))
        return self.raw.readinto(buffer)

    def close(self) -> None:
        self.raw.close()  # the socket's own reader: it keeps the socket open until closed
        super().close()


def _opener(deadline: float) -> urllib.request.OpenerDirector:
    """urllib's opener whose connections end every wait by ``deadline``: the send gets what
    is left after connecting, each read of the reply what is left then (one class set per
    request: http.client gives a reply only its socket, not its connection)."""

    class Response(http.client.HTTPResponse):
        def __init__(self, sock: socket.socket, *args: Any, **kw: Any) -> None:
            super().__init__(sock, *args, **kw)
            self.fp = io.BufferedReader(_ReadBy(self.fp.detach(), sock, deadline))

    class HTTP(http.client.HTTPConnection):
        response_class = Response

        def connect(self) -> None:
            super().connect()  # for HTTPS below: HTTPSConnection's, TLS handshake included
            self.sock.settimeout(_left(deadline))

    class HTTPS(HTTP, http.client.HTTPSConnection):
        pass

    class Plain(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(HTTP, req)

    class TLS(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(HTTPS, req)

    return urllib.request.build_opener(Plain, TLS)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def probe(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> None:
    """Raise a one-line ConfigError naming ``feedback.judge_url`` unless a server answers
    ``GET {url}/models`` (a run does not start against a dead judge)."""
    request = urllib.request.Request(url.rstrip("/") + "/models", headers=_headers(api_key))
    try:
        read_within(request, timeout_s)
    except urllib.error.HTTPError as exc:
        hint = (
            "set feedback.judge_api_key_env to the variable holding its key"
            if exc.code in (401, 403)
            else "is it an OpenAI-compatible endpoint (…/v1)?"
        )
        raise ConfigError(f"feedback.judge_url: {url} answered GET /models with HTTP "
                          f"{exc.code}; {hint}") from None  # fmt: skip
    except (OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"feedback.judge_url: no server answers at {url} ({reason})") from None


# --- the rewards -------------------------------------------------------------------------


def _observed(score: float, t: Trajectory) -> tuple[float, float, Any]:
    """(the judge's score, the length, the stratum) of a scored response for the length
    probe: the stratum is its prompt's group and what the task's verifier said of it (the
    environment's return), so the probe compares responses to one prompt, equally right."""
    return (
        score,
        float(t.length),
        (t.metadata.get("group"), float(sum(t.metadata.get("rewards", ())))),
    )


@dataclass
class PointwiseJudge:
    """R = (score − lo) / (hi − lo), the judge's rating of the last turn (module docstring)."""

    client: JudgeClient
    template: str
    lo: float = 0.0
    hi: float = 10.0
    repeat_check: float = 0.0
    seed: int = 0
    name: str = "judge"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        prompts = [self.template.format(prompt=t.prompt, response=t.response,
                                        reference=t.reference, lo=f"{self.lo:g}",
                                        hi=f"{self.hi:g}") for t in batch]  # fmt: skip
        replies = self.client.ask(prompts)
        parse = lambda r: None if r.text is None else parse_score(r.text, self.lo, self.hi)  # noqa: E731
        scores = [parse(r) for r in replies]
        rng = random.Random(_batch_seed(self.seed, prompts))
        again = [i for i in range(len(batch)) if rng.random() < self.repeat_check]
        repeats = self.client.ask([prompts[i] for i in again], fresh=[True] * len(again))
        stats = self.client.stats
        with stats.lock:
            for i, r in zip(again, repeats, strict=True):
                if scores[i] is not None and r.text is not None:
                    stats.repeats.append(parse(r) == scores[i])
            for t, s, r in zip(batch, scores, replies, strict=True):
                stats.invalid += r.text is not None and s is None
                if s is not None:
                    stats.scored.append(_observed(s, t))
        out = []
        for t, s, r in zip(batch, scores, replies, strict=True):
            if r.text is None:
                out.append(Score.failed(r.status, r.reason))
            elif s is None:
                out.append(Score.failed(RewardStatus.INVALID,
                                        f"judge: no score in [{self.lo:g}, {self.hi:g}] "
                                        f"in {r.text[:60]!r}"))  # fmt: skip
            else:
                out.append(on_last_turn(Score(s), t))
        return out


Verdict = tuple[int, int, float]
"""(i, j, w): w = 1 when i won the comparison, 0 when j did, ½ a tie."""


def pair_design(g: int, k: int | None = None) -> list[tuple[int, int]]:
    """Pairs (i, j), i ≠ j, of a group of ``g``: all g(g−1)/2 for ``k`` None, else the first
    ``k`` of the cyclic order — (i, i+1) for i < g−1 first (a path: every response in a
    comparison, the design connected), then the pair closing the ring, then distance 2, 3, …
    so the comparisons spread evenly over the responses. Needs g − 1 ≤ k ≤ g(g−1)/2."""
    everything = [(i, (i + d) % g) for d in range(1, g // 2 + 1) for i in range(g)]
    seen: set[frozenset[int]] = set()
    ordered = []
    for i, j in everything:  # distance g/2 lists each pair twice when g is even
        if frozenset((i, j)) not in seen:
            seen.add(frozenset((i, j)))
            ordered.append((min(i, j), max(i, j)))
    if k is None:
        return ordered
    if not g - 1 <= k <= len(ordered):
        raise ValueError(f"pair_design: need {g - 1} <= k <= {len(ordered)} for a group of {g}")
    return ordered[:k]


def bounded_pairs(k: int | None, g: int) -> int | None:
    """``k`` pairs (None: all) for a group of ``g``, within what :func:`pair_design` takes
    (config asks G − 1 ≤ K ≤ G(G−1)/2 of the full group; a smaller group gets what fits)."""
    return None if k is None else min(max(k, g - 1), g * (g - 1) // 2)


def win_rates(g: int, verdicts: Sequence[tuple[int, int, float]]) -> list[float | None]:
    """Each response's share of its comparisons won; ``verdicts`` are (i, j, w) with w = 1
    when i won, 0 when j won, ½ a tie. None for a response in no comparison."""
    won, played = [0.0] * g, [0] * g
    for i, j, w in verdicts:
        won[i] += w
        won[j] += 1.0 - w
        played[i] += 1
        played[j] += 1
    return [w / n if n else None for w, n in zip(won, played, strict=True)]


def bt_rewards(g: int, verdicts: Sequence[tuple[int, int, float]],
               prior: float = 0.1, iterations: int = 50) -> list[float | None]:  # fmt: skip
    """Bradley–Terry strengths fitted to the group's verdicts, as σ(s_i − s̄) ∈ (0, 1).

    Maximises Σ_(i,j,w) [w·log σ(s_i − s_j) + (1 − w)·log σ(s_j − s_i)] − (prior/2)·Σ s_i²
    by Newton's method (the objective is concave; the ridge ``prior`` keeps the strengths
    finite when one response wins all its comparisons, and 0 gives the maximum-likelihood
    fit, unique up to a shift when the comparisons connect the group). None for a response
    in no comparison."""
    wins = torch.zeros(g, g, dtype=torch.float64)  # wins[i, j]: i over j, ties ½ each
    for i, j, w in verdicts:
        wins[i, j] += w
        wins[j, i] += 1.0 - w
    n = wins + wins.T
    s = torch.zeros(g, dtype=torch.float64)
    for _ in range(iterations):
        p = torch.sigmoid(s[:, None] - s[None, :])  # p[i, j] = P(i beats j)
        grad = (wins - n * p).sum(1) - prior * s
        c = n * p * (1 - p)
        hessian = c - torch.diag(c.sum(1)) - prior * torch.eye(g, dtype=torch.float64)
        step = torch.linalg.lstsq(hessian, grad[:, None]).solution[:, 0]  # min-norm: no shift
        s = s - step
        if float(step.abs().max()) < 1e-10:
            break
    strength = torch.sigmoid(s - s.mean()).tolist()
    played = n.sum(1)
    return [x if played[i] > 0 else None for i, x in enumerate(strength)]


AGGREGATE: dict[str, Callable[[int, Sequence[Verdict]], list[float | None]]] = {
    "winrate": win_rates,
    "bt": bt_rewards,
}


@dataclass
class ComparisonReward:
    """Per-response rewards from pairwise verdicts within each group (module docstring).

    Trajectories are grouped by ``metadata["group"]`` (the prompt's group id); a
    trajectory without one is a group of its own, and so has no comparison (``INVALID``
    would be the model's fault: it is ``INFRA_ERROR``, a misuse)."""

    client: JudgeClient
    template: str
    aggregate: Literal["winrate", "bt"] = "winrate"
    pairs: int | None = None
    position_check: float = 0.0
    repeat_check: float = 0.0
    seed: int = 0
    name: str = "comparison"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        groups = _groups(batch)
        asks: list[tuple[int, int]] = []  # (first shown, second shown), batch indices
        ties: list[Verdict] = []  # the same text twice: a tie, never asked
        rng = random.Random(_batch_seed(self.seed, [t.prompt + t.response for t in batch]))
        for members in groups.values():
            if len(members) < 2:
                continue
            for i, j in pair_design(len(members), bounded_pairs(self.pairs, len(members))):
                a, b = members[i], members[j]
                if batch[a].response == batch[b].response:
                    ties.append((a, b, 0.5))
                else:
                    asks.append((a, b) if rng.random() < 0.5 else (b, a))
        swapped = [(b, a) for a, b in asks if rng.random() < self.position_check]
        again = [x for x in asks if rng.random() < self.repeat_check]
        shown = asks + swapped
        prompts = [self._prompt(batch, a, b) for a, b in shown + again]
        replies = self.client.ask(prompts, fresh=[False] * len(shown) + [True] * len(again))
        choices = [None if r.text is None else parse_choice(r.text) for r in replies]
        self._record(shown, again, choices, replies, len(ties))
        n = len(shown)
        return self._scores(batch, groups, shown, choices[:n], replies[:n], ties)

    def _prompt(self, batch: Sequence[Trajectory], a: int, b: int) -> str:
        t = batch[a]
        return self.template.format(prompt=t.prompt, first=t.response,
                                    second=batch[b].response, reference=t.reference)  # fmt: skip

    def _record(self, shown: list[tuple[int, int]], again: list[tuple[int, int]],
                choices: list[float | None], replies: list[Reply], ties: int) -> None:  # fmt: skip
        n = len(shown)
        outcome: dict[tuple[int, int], int | None] = {}  # (a, b) as shown → preferred; None: tie
        for (a, b), c in zip(shown, choices[:n], strict=True):
            if c is not None:
                outcome[a, b] = None if c == 0.5 else (a, b)[int(c)]
        stats = self.client.stats
        with stats.lock:
            stats.pairs += n + ties
            stats.invalid += sum(r.text is not None and c is None
                                 for r, c in zip(replies, choices, strict=True))  # fmt: skip
            stats.first_preferred += [c == 0 for c in choices[:n] if c is not None and c != 0.5]
            for (a, b), w in outcome.items():
                if (b, a) in outcome and a < b:  # shown both ways: one observation per pair
                    stats.position.append(w == outcome[b, a])
            for (a, b), c in zip(again, choices[n:], strict=True):
                if c is not None and (a, b) in outcome:
                    stats.repeats.append((None if c == 0.5 else (a, b)[int(c)]) == outcome[a, b])

    def _scores(self, batch: Sequence[Trajectory], groups: dict[Any, list[int]],
                shown: list[tuple[int, int]], choices: list[float | None],
                replies: list[Reply], ties: list[Verdict]) -> list[Score]:  # fmt: skip
        failures: dict[int, list[Reply]] = {}
        verdicts: dict[int, list[tuple[int, int, float]]] = {}  # by first shown: (a, b, w_a)
        for a, b, w in ties:
            verdicts.setdefault(a, []).append((a, b, w))
        for (a, b), c, r in zip(shown, choices, replies, strict=True):
            if c is None:
                why = f"judge: no A, B or TIE in {(r.text or '')[:60]!r}"
                bad = r if r.text is None else Reply(None, RewardStatus.INVALID, why)
                failures.setdefault(a, []).append(bad)
                failures.setdefault(b, []).append(bad)
            else:
                verdicts.setdefault(a, []).append((a, b, 1.0 - c))  # c = 0: a, the first, won
        out: list[Score | None] = [None] * len(batch)
        aggregate = AGGREGATE[self.aggregate]
        for members in groups.values():
            local = {k: m for m, k in enumerate(members)}
            seen = [(local[a], local[b], w) for k in members for a, b, w in verdicts.get(k, ())]
            rewards = aggregate(len(members), seen)
            for k, reward in zip(members, rewards, strict=True):
                if reward is not None:
                    out[k] = on_last_turn(Score(reward), batch[k])
                    with self.client.stats.lock:
                        self.client.stats.scored.append(_observed(reward, batch[k]))
                    continue
                lost = failures.get(k, [])
                status = worst(r.status for r in lost) if lost else RewardStatus.INFRA_ERROR
                reason = lost[0].reason if lost else "comparison: no other response to compare with"
                out[k] = Score.failed(status, reason)
        return [s for s in out if s is not None]


@dataclass
class LearnedComparison:
    """Per-response rewards from a learned pairwise model's verdicts within each group: the
    Bradley–Terry reward model's P(i ≻ j) = σ(r_i − r_j) on the same pair design, as a soft
    verdict (w = that probability), aggregated as :class:`ComparisonReward` does. The
    scores r come in ``metadata["learned"]`` (the loop scores the batch first); a
    trajectory without one is ``INFRA_ERROR``. No position probe: the verdict is symmetric
    by construction."""

    aggregate: Literal["winrate", "bt"] = "winrate"
    pairs: int | None = None
    stats: JudgeStats = field(default_factory=JudgeStats)
    name: str = "comparison"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        groups = _groups(batch)
        out: list[Score] = [Score.failed(RewardStatus.INFRA_ERROR, "comparison: no score")] * len(
            batch
        )
        for members in groups.values():
            scored = [k for k in members if "learned" in batch[k].metadata]
            if len(scored) < 2:
                continue
            pairs = pair_design(len(scored), bounded_pairs(self.pairs, len(scored)))
            r = [float(batch[k].metadata["learned"]) for k in scored]
            verdicts = [(i, j, 1.0 / (1.0 + math.exp(r[j] - r[i]))) for i, j in pairs]
            with self.stats.lock:
                self.stats.pairs += len(pairs)
            for k, reward in zip(scored, AGGREGATE[self.aggregate](len(scored), verdicts),
                                 strict=True):  # fmt: skip
                if reward is not None:
                    out[k] = on_last_turn(Score(reward), batch[k])
                    with self.stats.lock:
                        self.stats.scored.append(_observed(reward, batch[k]))
        return out


def _groups(batch: Sequence[Trajectory]) -> dict[Any, list[int]]:
    """Batch indices by ``metadata["group"]``, in batch order; no group: a group of one."""
    groups: dict[Any, list[int]] = {}
    for k, t in enumerate(batch):
        groups.setdefault(t.metadata.get("group", ("alone", k)), []).append(k)
    return groups


def _batch_seed(seed: int, texts: Sequence[str]) -> int:
    """A seed of the run's seed and the batch's texts: the probes' draws repeat with them."""
    h = hashlib.blake2b(str(seed).encode(), digest_size=8)
    for text in texts:
        h.update(text.encode())
    return int.from_bytes(h.digest(), "big")


def api_key(f: FeedbackParams) -> str | None:
    """The key in ``feedback.judge_api_key_env``'s variable; a one-line ConfigError naming
    the field when it is not set."""
    if f.judge_api_key_env is None:
        return None
    key = os.environ.get(f.judge_api_key_env)
    if not key:
        raise ConfigError(f"feedback.judge_api_key_env: the environment variable "
                          f"{f.judge_api_key_env} is not set")  # fmt: skip
    return key


def judge_reward(
    f: FeedbackParams, seed: int
) -> PointwiseJudge | ComparisonReward | LearnedComparison:
    """The reward of ``feedback.source=judge`` (pointwise) or ``comparison`` (pairwise), its
    client built from the ``feedback.judge_*`` fields (validated in config); comparisons
    by the learned reward model need no client."""
    pairs = None if f.comparison_pairs == "all" else f.comparison_pairs
    if not f.uses_judge:
        return LearnedComparison(aggregate=f.comparison, pairs=pairs)
    assert f.judge_url is not None  # validated: a judged source needs one
    client = JudgeClient(f.judge_url, f.judge_model, timeout_s=f.judge_timeout_s,
                         retries=f.judge_retries, concurrency=f.judge_concurrency,
                         max_tokens=f.judge_max_tokens, temperature=f.judge_temperature,
                         api_key=api_key(f))  # fmt: skip
    if f.source == "judge":
        return PointwiseJudge(client, load_template(f.judge_template, "pointwise"),
                              lo=f.judge_min, hi=f.judge_max,
                              repeat_check=f.judge_repeat_check, seed=seed)  # fmt: skip
    return ComparisonReward(client, load_template(f.judge_template, "pairwise"),
                            aggregate=f.comparison, pairs=pairs,
                            position_check=f.judge_position_check,
                            repeat_check=f.judge_repeat_check, seed=seed)  # fmt: skip


def judge_samples(reward: object, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Add a pointwise judge's verdict on each held-out sample row (its final answer) as
    ``judge`` (the reward, or None) and ``judge_status``, and return what that cost
    (``eval/judge/calls``, ``eval/judge/prompt_tokens``, ``eval/judge/completion_tokens``)
    and the mean verdict (``eval/judge/mean``); nothing for other rewards. The requests go
    through the training judge's cache, not into its ``judge/*`` (the bias probes read
    training rollouts only)."""
    if not isinstance(reward, PointwiseJudge) or not rows:
        return {}
    own = replace(reward, client=replace(reward.client, stats=JudgeStats()), repeat_check=0.0)
    seen = [Trajectory(prompt=r["prompt"], turns=(r["answer"],), reference=r["reference"],
                       length=r["length"], max_length=max(r["length"], 1),
                       metadata={"rewards": (r["reward"],)}) for r in rows]  # fmt: skip
    scores = score_batch(own, seen)
    for row, score in zip(rows, scores, strict=True):
        row["judge"] = score.value if score.ok else None
        row["judge_status"] = score.status.name.lower()
    spent = own.client.stats.drain()
    ok = [s.value for s in scores if s.ok]
    return {f"eval/{k}": spent[k] for k in ("judge/calls", "judge/prompt_tokens",
                                             "judge/completion_tokens")} | (
        {"eval/judge/mean": sum(ok) / len(ok)} if ok else {})  # fmt: skip


def judge_metrics(reward: object) -> dict[str, float]:
    """The ``judge/*`` metrics since the last call, when ``reward`` is a judge or a learned
    comparison; else none."""
    client = getattr(reward, "client", None)
    stats = client.stats if isinstance(client, JudgeClient) else getattr(reward, "stats", None)
    return stats.drain() if isinstance(stats, JudgeStats) else {}
