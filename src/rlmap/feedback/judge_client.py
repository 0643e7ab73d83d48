"""The judge's HTTP client: an OpenAI-compatible endpoint asked with bounded concurrency,
a deadline per request, retries with backoff and a reply cache (:class:`JudgeClient`), and
the bias probes' statistics (:class:`JudgeStats`). What the ``judge/*`` metrics mean is in
:mod:`rlmap.feedback.judge`'s docstring.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError

CACHE_SIZE = 100_000
"""Replies kept in a client's cache (a few MB), the oldest dropped first."""
BACKOFF_S = 0.25
"""The first retry's wait; each later one waits twice as long."""


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
            for name, seen in (
                ("first_preferred_frac", self.first_preferred),
                ("position_agreement", self.position),
                ("self_consistency", self.repeats),
            ):
                if seen:
                    out[f"judge/{name}"] = sum(seen) / len(seen)
            corr = within_outcome_corr(self.scored)
            if corr is not None:
                out["judge/length_corr"] = corr
            fresh = JudgeStats()
            for f in (
                "calls",
                "cache_hits",
                "failed",
                "invalid",
                "prompt_tokens",
                "completion_tokens",
                "pairs",
                "first_preferred",
                "position",
                "repeats",
                "scored",
            ):
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
        with ThreadPoolExecutor(
            max_workers=min(self.concurrency, len(jobs)), thread_name_prefix="rlmap-judge"
        ) as pool:
            replies = list(pool.map(lambda job: self._one(*job), jobs))
        with self.stats.lock:  # a copy shares its reply: a hit, or a failure like it
            self.stats.cache_hits += sum(replies[k].text is not None for k in copies)
            self.stats.failed += sum(replies[k].text is None for k in copies)
        return [replies[k] for k in where]

    def _one(self, prompt: str, fresh: bool) -> Reply:
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            },
            sort_keys=True,
        ).encode()
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
        request = urllib.request.Request(
            self.url.rstrip("/") + "/chat/completions", data=body, headers=_headers(self.api_key)
        )
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
            except (
                OSError,
                http.client.HTTPException,
                ValueError,
                KeyError,
                IndexError,
                TypeError,
                AttributeError,
            ) as exc:
                failure = Reply(
                    None,
                    RewardStatus.INFRA_ERROR,
                    f"judge: bad reply ({type(exc).__name__}: {exc})",
                )
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
        raise ConfigError(
            f"feedback.judge_url: {url} answered GET /models with HTTP {exc.code}; {hint}"
        ) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"feedback.judge_url: no server answers at {url} ({reason})") from None
