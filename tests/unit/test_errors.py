"""The one exception tree: drawn in its docstring as it is, and mapped to HTTP in one table."""

from __future__ import annotations

import inspect
import re

import pytest

from webctx import errors
from webctx.api.http import error_response


def _drawn() -> dict[str, str]:
    """name -> parent name, from the `+--` lines of the module docstring."""
    parents: dict[int, str] = {}
    drawn: dict[str, str] = {}
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^([| ]*)\+-- (\w+)", line)
        if found is None:
            continue
        depth = len(found.group(1)) // 4
        drawn[found.group(2)] = parents.get(depth - 1, "WebctxError")
        parents[depth] = found.group(2)
    return drawn


def test_the_docstring_draws_every_error_under_one_of_its_bases() -> None:
    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, errors.WebctxError)}  # fmt: skip
    drawn = _drawn()
    assert set(drawn) == set(classes) - {"WebctxError"}
    for name, parent in drawn.items():
        assert parent in {base.__name__ for base in classes[name].__bases__}, name


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (errors.Unauthorized("no key"), 401, "unauthorized"),
        (errors.TooManyRequests("slow down", retry_after_s=3), 429, "rate_limited"),
        (errors.JobNotFound("j"), 404, "not_found"),
        (errors.BatchNotFound("b"), 404, "not_found"),
        (errors.Conflict("busy"), 409, "conflict"),
        (errors.BatchConflict("taken"), 409, "conflict"),
        (errors.InvalidRequest("bad"), 422, "invalid_request"),
        (errors.InvalidTenant("bad"), 422, "invalid_request"),
        (errors.InvalidBatch("bad"), 422, "invalid_request"),
        (errors.RateLimited(retry_after=1.0), 503, "provider_rate_limited"),
        (errors.ProviderUnavailable("down"), 503, "unavailable"),
        (errors.ConfigError("unset"), 503, "misconfigured"),
        (errors.ProviderError("qdrant", "refused"), 502, "provider_error"),
        (errors.ProviderDown("openai", "embeddings provider openai at … is down"), 503,
         "provider_down"),
        (errors.BlockedURL("http://x.test/", "robots.txt"), 502, "fetch_error"),
        (errors.WebctxError("other"), 500, "internal"),
    ],
)
def test_the_api_maps_each_error_to_one_status(
    error: errors.WebctxError, status: int, code: str
) -> None:
    response = error_response(error)
    assert response.status_code == status
    assert f'"error":"{code}"' in response.body.decode()
