"""Embed texts in as few provider requests as the caps allow, retrying transient failures.

The steps are separate so a cross-worker rate limiter (`before_request`) and an
embedding cache (filter texts before `plan_batches`) can slot in without a rewrite:

    prepare_texts -> plan_batches -> for each batch: before_request, embedder.embed

`embed_with_cache` puts both in: cache hits never reach `embed_texts`, and the embedder
is wrapped in `LimitedEmbedder`, which reserves each request's tokens in the shared
Redis limiter before sending, and feeds the answer's rate-limit headers (or 429) back.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from webctx.errors import (
    ConfigError,
    ProviderDown,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)
from webctx.protocols import Embedder, EmbeddingCache, Embeddings
from webctx.tokens import count_tokens, truncate_to_tokens

if TYPE_CHECKING:
    from webctx.net.ratelimit import RedisRateLimiter

logger = logging.getLogger(__name__)
T = TypeVar("T")
BeforeRequest = Callable[["Batch"], None]
# OpenAI refuses an empty string input; a single space embeds as "nothing" and is accepted.
_EMPTY_STAND_IN = " "


@dataclass(frozen=True)
class Batch:
    """One provider request: positions of its texts in the input, and their token total."""

    indices: tuple[int, ...]
    tokens: int


class EmbedOutcome(BaseModel):
    """Vectors in input order, plus what it took to get them."""

    vectors: list[list[float]]
    requests: int = 0
    tokens: int = 0
    retries: int = 0
    truncated: int = 0


@dataclass(frozen=True)
class PreparedTexts:
    """Texts as they will be sent, their token counts, and how many were cut."""

    texts: list[str]
    tokens: list[int]
    truncated: int


def prepare_texts(texts: Sequence[str], *, max_input_tokens: int) -> PreparedTexts:
    """Cut texts to `max_input_tokens` and count their tokens."""
    prepared: list[str] = []
    counts: list[int] = []
    truncated = 0
    for text in texts:
        text = text if text.strip() else _EMPTY_STAND_IN
        n = count_tokens(text)
        if n > max_input_tokens:
            # Sending it would earn a 400 for the whole batch; a prefix still carries meaning.
            text = truncate_to_tokens(text, max_input_tokens)
            n = count_tokens(text)
            truncated += 1
        prepared.append(text)
        counts.append(n)
    return PreparedTexts(prepared, counts, truncated)


@dataclass
class _Bin:
    members: list[int]
    tokens: int


def _pack(
    order: Sequence[int],
    counts: Sequence[int],
    max_inputs: int,
    max_tokens: int,
    *,
    first_fit: bool,
) -> list[Batch]:
    """Greedy packing in `order`: into the last open batch (next-fit) or the first with room."""
    bins: list[_Bin] = []
    for i in order:
        open_bins = bins if first_fit else bins[-1:]
        target = next(
            (
                b
                for b in open_bins
                if len(b.members) < max_inputs and b.tokens + counts[i] <= max_tokens
            ),
            None,
        )
        if target is None:
            bins.append(_Bin([i], counts[i]))
        else:
            target.members.append(i)
            target.tokens += counts[i]
    return [Batch(tuple(sorted(b.members)), b.tokens) for b in bins]


def plan_batches(
    token_counts: Sequence[int], *, max_inputs: int, max_tokens_per_request: int
) -> list[Batch]:
    """Group texts into the fewest requests under both caps; in input order when that is
    as good, else first-fit-decreasing by tokens."""
    if max_inputs < 1 or max_tokens_per_request < 1:
        raise ConfigError("embedding request caps must be positive")
    if any(n > max_tokens_per_request for n in token_counts):
        raise ConfigError("a text exceeds max_tokens_per_request; truncate it first")
    n = len(token_counts)
    in_order = _pack(range(n), token_counts, max_inputs, max_tokens_per_request, first_fit=False)
    lower_bound = max(-(-n // max_inputs), -(-sum(token_counts) // max_tokens_per_request))
    if len(in_order) <= lower_bound:
        return in_order
    by_size = sorted(range(n), key=lambda i: -token_counts[i])
    packed = _pack(by_size, token_counts, max_inputs, max_tokens_per_request, first_fit=True)
    return packed if len(packed) < len(in_order) else in_order


def backoff_delay(
    attempt: int, exc: Exception, *, base_delay_s: float, max_delay_s: float
) -> float:
    """Seconds before retry number `attempt` (1-based): the server's `retry_after` plus a
    little jitter, else exponential backoff with jitter so workers do not retry in step,
    cut to when the shared breaker decides on the outage (`verdict_in_s`)."""
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        return exc.retry_after + random.uniform(0, 0.1 * exc.retry_after + 0.05)
    cap = min(max_delay_s, base_delay_s * 2 ** (attempt - 1))
    delay = random.uniform(cap / 2, cap)
    verdict = exc.verdict_in_s if isinstance(exc, ProviderUnavailable) else None
    # Never past the shared breaker's verdict on the outage: then a retry ends or goes on.
    return delay if verdict is None else min(delay, verdict)


def call_with_retries(
    call: Callable[[], T],
    *,
    max_attempts: int,
    sleep: Callable[[float], None],
    base_delay_s: float,
    max_delay_s: float,
) -> tuple[T, int]:
    """`call()`'s result and how many retries it took. Retries RateLimited and
    ProviderUnavailable; re-raises when attempts run out or the server asks for a wait
    longer than `max_delay_s` (a Celery countdown should carry that, not a blocked worker)."""
    if max_attempts < 1:
        raise ConfigError("max_attempts must be at least 1")
    for attempt in range(1, max_attempts):
        try:
            return call(), attempt - 1
        except (RateLimited, ProviderUnavailable) as exc:
            if isinstance(exc, RateLimited) and (exc.retry_after or 0) > max_delay_s:
                raise
            delay = backoff_delay(attempt, exc, base_delay_s=base_delay_s, max_delay_s=max_delay_s)
            logger.warning(
                "embed request retried",
                extra={"attempt": attempt, "delay_s": round(delay, 3), "exc": repr(exc)},
            )
            sleep(delay)
    return call(), max_attempts - 1


def _request(
    embedder: Embedder, texts: list[str], batch: Batch, before_request: BeforeRequest | None
) -> list[list[float]]:
    """One attempt at one batch."""
    if before_request is not None:
        before_request(batch)
    vectors = embedder.embed(texts).vectors
    if len(vectors) != len(texts):
        raise ProviderError(embedder.model, f"{len(vectors)} vectors for {len(texts)} texts")
    return vectors


def embed_texts(
    texts: Sequence[str],
    embedder: Embedder,
    *,
    max_inputs: int,
    max_tokens_per_request: int,
    max_input_tokens: int,
    max_attempts: int,
    sleep: Callable[[float], None] = time.sleep,
    before_request: BeforeRequest | None = None,
    base_delay_s: float = 0.5,
    max_delay_s: float = 20.0,
    parallel: int = 1,
) -> EmbedOutcome:
    """One vector per text, in order, using the fewest requests the caps allow.

    Texts over `max_input_tokens` are truncated, never refused. `before_request(batch)` runs
    before every attempt (a shared rate limiter can block there). Up to `parallel` requests
    are in flight at once, each with its own retries. Raises RateLimited or
    ProviderUnavailable once a request's attempts are exhausted, ProviderError at once;
    with several in flight, once the others have ended (the first error in batch order)."""
    cap = min(max_input_tokens, max_tokens_per_request)
    prepared = prepare_texts(texts, max_input_tokens=cap)
    batches = plan_batches(
        prepared.tokens, max_inputs=max_inputs, max_tokens_per_request=max_tokens_per_request
    )
    vectors: list[list[float]] = [[] for _ in prepared.texts]
    outcome = EmbedOutcome(vectors=[], truncated=prepared.truncated)

    def send(batch: Batch) -> tuple[list[list[float]], int]:
        batch_texts = [prepared.texts[i] for i in batch.indices]
        call = partial(_request, embedder, batch_texts, batch, before_request)
        return call_with_retries(
            call,
            max_attempts=max_attempts,
            sleep=sleep,
            base_delay_s=base_delay_s,
            max_delay_s=max_delay_s,
        )

    for batch, (got, retries) in zip(batches, _each(send, batches, parallel), strict=True):
        for i, vector in zip(batch.indices, got, strict=True):
            vectors[i] = vector
        outcome.requests += 1
        outcome.tokens += batch.tokens
        outcome.retries += retries
    outcome.vectors = vectors
    return outcome


def parallel_requests(embedder: Embedder, setting: int) -> int:
    """Requests of one call to send at once: `setting`, or 1 for an embedder that computes
    in this process (its requests would only take turns on the same cores)."""
    return 1 if getattr(embedder, "in_process", False) else setting


def _each(send: Callable[[Batch], T], batches: Sequence[Batch], parallel: int) -> list[T]:
    """`send(batch)` of each batch, in order; up to `parallel` at once on threads of their
    own (a page over the input cap needs several requests: one after another they cost a
    round trip each). Every send ends before this returns or raises."""
    if parallel < 1:
        raise ConfigError("parallel requests must be at least 1")
    if parallel == 1 or len(batches) < 2:
        return [send(b) for b in batches]
    with ThreadPoolExecutor(min(parallel, len(batches)), "embed-request") as pool:
        # The first failure in batch order raises, once leaving the block has waited for
        # every send.
        return list(pool.map(send, batches))


class CachedEmbedOutcome(EmbedOutcome):
    """An EmbedOutcome plus what the cache saved."""

    cache_hits: int = 0
    tokens_saved: int = 0


class LimitedEmbedder:
    """An Embedder whose every request first reserves its tokens in a shared limiter.

    A 429 pauses the key for every process (for its retry-after) and releases the
    reservation; every answer's x-ratelimit-* headers (a 429's too) adapt the shared
    budget. The headers come with each call's own answer, so concurrent calls on one
    embedder never read each other's."""

    def __init__(self, inner: Embedder, limiter: RedisRateLimiter) -> None:
        self.inner, self.limiter = inner, limiter
        self.model = inner.model
        self.dimensions: int | None = getattr(inner, "dimensions", None)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One vector per text, sent once the shared limiter grants the tokens."""
        reservation = self.limiter.acquire(sum(count_tokens(t) for t in texts))
        try:
            answer = self.inner.embed(texts)
        except RateLimited as exc:
            self.limiter.settle(reservation, sent=False)
            self.limiter.pause(exc.retry_after if exc.retry_after is not None else 1.0)
            self._observe(exc.rate_limits)
            raise
        except ProviderDown:  # its breaker is open: nothing was sent
            self.limiter.settle(reservation, sent=False)
            raise
        except Exception:
            self.limiter.settle(reservation)  # it may have been counted: keep it
            raise
        self.limiter.settle(reservation)
        self._observe(answer.rate_limits)
        return answer

    def _observe(self, rate_limits: Mapping[str, str]) -> None:
        if rate_limits:
            self.limiter.observe(rate_limits)


def embed_with_cache(
    texts: Sequence[str],
    embedder: Embedder,
    *,
    cache: EmbeddingCache | None,
    limiter: RedisRateLimiter | None,
    max_inputs: int,
    max_tokens_per_request: int,
    max_input_tokens: int,
    max_attempts: int,
    sleep: Callable[[float], None] = time.sleep,
    parallel: int = 1,
) -> CachedEmbedOutcome:
    """`embed_texts`, but texts the cache knows are not sent (nor repeats within `texts`),
    and requests go through the shared limiter when one is given."""
    dimensions: int | None = getattr(embedder, "dimensions", None)
    cached: list[list[float] | None] = [None] * len(texts)
    if cache is not None:
        cached = cache.get_many(embedder.model, dimensions, texts)
    misses: dict[str, list[int]] = {}
    for i, (text, vector) in enumerate(zip(texts, cached, strict=True)):
        if vector is None:
            misses.setdefault(cache_text(text), []).append(i)
    sender: Embedder = embedder if limiter is None else LimitedEmbedder(embedder, limiter)
    if limiter is not None and limiter.tpm is not None:
        # A request over the whole TPM budget could never be admitted.
        max_tokens_per_request = min(max_tokens_per_request, limiter.tpm)
    fresh = embed_texts(
        [texts[idx[0]] for idx in misses.values()],
        sender,
        max_inputs=max_inputs,
        max_tokens_per_request=max_tokens_per_request,
        max_input_tokens=max_input_tokens,
        max_attempts=max_attempts,
        sleep=sleep,
        parallel=parallel,
    )
    if cache is not None and misses:
        cache.set_many(embedder.model, dimensions, list(misses), fresh.vectors)
    for indices, vector in zip(misses.values(), fresh.vectors, strict=True):
        for i in indices:
            cached[i] = vector
    sent = {indices[0] for indices in misses.values()}
    hits = [text for i, text in enumerate(texts) if i not in sent]
    saved = prepare_texts(hits, max_input_tokens=min(max_input_tokens, max_tokens_per_request))
    return CachedEmbedOutcome(
        **fresh.model_dump(exclude={"vectors"}),
        vectors=[v for v in cached if v is not None],
        cache_hits=len(hits),
        tokens_saved=sum(saved.tokens),
    )


def cache_text(text: str) -> str:
    """The form of a text the embedding cache keys on: whitespace runs collapsed to one
    space, ends stripped (texts that differ only there share a vector)."""
    return " ".join(text.split())  # str.split's whitespace is exactly regex \\s: one pass
