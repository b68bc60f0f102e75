"""all-MiniLM-L6-v2 as an ONNX file, exported once from the packaged weights and cached.

The graph holds the whole sentence-transformers pipeline after tokenization (BERT, mean
pooling over the attention mask, L2 normalisation), so a run needs only onnxruntime and
the `tokenizers` fast tokenizer: torch is imported only to export. The int8 file is the
fp32 one with dynamic quantization (weights int8 in 7 bits, activations quantized per batch).

The cache key is the sha256 of the packaged model files, the onnxruntime version and this
module's recipe version: new weights, a new runtime or a new recipe export afresh. Files
are written under a temporary name and renamed into place (atomic on one filesystem), and
an exclusive file lock makes a second process wait for the first one's export instead of
exporting too (an export costs about 15 s of CPU and 500 MB).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

MODEL_NAME = "all-MiniLM-L6-v2"
RECIPE = "2"  # bump when the exported graph or the quantization changes
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "embedding"

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """The user's cache directory for webctx (platformdirs), `~/.cache/webctx` without it."""
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "webctx"
    return Path(user_cache_dir("webctx", appauthor=False))


def runtime_version() -> str:
    """The installed onnxruntime's version (part of the cache key: its quantizer writes
    the int8 file), or `none`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime")
    except PackageNotFoundError:
        return "none"


def model_key(model_dir: Path, ort_version: str) -> str:
    """sha256 of every file under `model_dir` (paths and bytes), the runtime, the recipe."""
    digest = hashlib.sha256(f"recipe={RECIPE};onnxruntime={ort_version}".encode())
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def ensure_model(model_dir: Path, cache_dir: Path, *, quantized: bool, ort_version: str) -> Path:
    """The cached ONNX file for `model_dir`, exported (and quantized) first if missing."""
    folder = cache_dir / f"{MODEL_NAME}-{model_key(model_dir, ort_version)[:20]}"
    fp32, int8 = folder / "model.onnx", folder / "model.int8.onnx"
    target = int8 if quantized else fp32
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder / ".lock"):
        if not fp32.exists():
            started = time.perf_counter()
            _write_atomic(fp32, export_onnx(model_dir))
            _log_written(fp32, started)
        if quantized and not int8.exists():
            started = time.perf_counter()
            _write_atomic(int8, quantize_int8(fp32))
            _log_written(int8, started)
    return target


def export_onnx(model_dir: Path) -> bytes:
    """The fp32 graph (ids, mask, type ids -> unit sentence vectors) from the weights."""
    import torch
    from transformers import AutoModel

    # eager attention: a plain graph that every onnxruntime kernel handles
    bert = AutoModel.from_pretrained(str(model_dir), local_files_only=True,
                                     attn_implementation="eager").eval()  # fmt: skip

    class SentenceGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> object:
            hidden = self.bert(input_ids=ids, attention_mask=mask,
                               token_type_ids=types).last_hidden_state  # fmt: skip
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    sample = torch.ones(2, 8, dtype=torch.long)
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    # The tracer warns about Python branches on shapes that are fixed for this model.
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = Path(tmp) / "model.onnx"
        torch.onnx.export(
            SentenceGraph(), (sample, torch.ones_like(sample), torch.zeros_like(sample)), out,
            input_names=list(INPUTS), output_names=[OUTPUT],
            dynamic_axes={**axes, OUTPUT: {0: "batch"}}, opset_version=17,
            dynamo=False,  # the TorchScript exporter needs no onnxscript
        )  # fmt: skip
        return out.read_bytes()


def quantize_int8(fp32: Path) -> bytes:
    """`fp32` with dynamic int8 quantization of its MatMul weights: a scale per channel,
    7-bit weights (`reduce_range`).

    Per-tensor scales, or quantizing the embedding tables (Gather) as well, cost parity:
    cosine to the torch vectors fell to 0.92 at worst on 865 real chunks. 7-bit weights
    because the CPU decides the arithmetic: without VNNI (AVX2 alone, AVX-512 without VNNI)
    ONNX Runtime adds u8 x s8 products pairwise in 16 bits with saturation, and full 8-bit
    weights overflow there (0.967 at worst on an emulated AVX2 EPYC, 0.959 on a real one)
    while VNNI, summing in 32 bits, gave 0.985; with 7 bits no pair sum overflows, so every
    CPU computes the same vectors (bench/int8_parity.py, docs/benchmarks.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=fp32.parent) as tmp:
        dest = Path(tmp) / "int8.onnx"
        quantize_dynamic(fp32, dest, weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True, op_types_to_quantize=["MatMul"])  # fmt: skip
        return dest.read_bytes()


def _log_written(path: Path, started: float) -> None:
    ms = round((time.perf_counter() - started) * 1000)
    logger.info("onnx model written", extra={"path": str(path), "ms": ms,
                                             "bytes": path.stat().st_size})  # fmt: skip


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that no reader ever sees a partial file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (released if the process dies)."""
    with lock_path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
