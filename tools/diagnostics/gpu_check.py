"""One command for the GPU session: every GPU path of stage 4, with PASS/FAIL lines.

    python -m tools.diagnostics.gpu_check                # environment, models, tests, benchmarks
    python -m tools.diagnostics.gpu_check --only tests   # the @pytest.mark.gpu tests of ch. 17-22
    python -m tools.diagnostics.gpu_check --only bench   # decode step times + a short offline run
    python -m tools.diagnostics.gpu_check --only full    # 256 requests, transformers beside it
    python -m tools.diagnostics.gpu_check --only matrix  # the same: overlap on/off x radix/naive

What it does, in order (each part in its own process, so one crash does not hide the rest):

1. ``env``: GPU, torch, transformers, flashinfer, triton versions (FAIL if flashinfer or
   triton cannot be imported).
2. ``models``: builds ``models/qwen3-0.6b-shaped`` if it is missing (needs
   ``models/qwen3-tokenizer``; about a minute and 1.2 GB), notes whether SmolLM2 is there.
3. ``tests``: the GPU tests of ``tests/test_ch17..22_*.py`` (FlashInfer vs torch logits,
   cached prefix, hybrids, kernels vs references, sampling, graphs on/off, Triton
   kernels, SmolLM2 vs HF on GPU when SmolLM2 is converted), one PASS/FAIL/SKIP line each.
4. ``bench``: ``minisgl.benchmark.decode_step`` at batch 1, 8, 64, 256 (graphs on/off beside
   the bandwidth floor) and a 64-request offline run; prints the tables and whether batch 1
   meets the 0.6 ms target.
5. ``full`` (only when asked): ``minisgl.benchmark.offline --hf``, the whole 133,966-token
   workload beside ``transformers`` (about 5 minutes, most of it transformers), and
   ``matrix``: ``--matrix``, overlap on/off x radix/naive (about 3 minutes). Each fits one
   10-minute command; run them as separate calls.

FlashInfer compiles its kernels on first use (one to three minutes on a fresh machine,
cached on disk afterwards): the first part that touches them is the slow one. Exit status
is 1 if anything failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("MINISGL_MODELS_DIR", ROOT / "models"))
SHAPED = MODELS / "qwen3-0.6b-shaped"
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct"
TESTS = sorted(  # the stage-4 chapters' test files: their GPU tests
    str(p.relative_to(ROOT))
    for n in range(17, 23)
    for p in (ROOT / "tests").glob(f"test_ch{n}_*.py")
)
failures: List[str] = []


def line(status: str, name: str, detail: str = "") -> None:
    print(f"{status:<4} {name}" + (f"  -- {detail}" if detail else ""), flush=True)
    if status == "FAIL":
        failures.append(name)


def run(cmd: List[str], timeout: int, name: str) -> subprocess.CompletedProcess | None:
    """Run ``cmd`` from the repository root, echoing its output; FAIL on error or timeout."""
    print(f"\n$ {' '.join(cmd)}", flush=True)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    start = time.perf_counter()
    try:
        res = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        print((e.stdout or b"")[-4000:] if isinstance(e.stdout, str) else "", flush=True)
        line("FAIL", name, f"timed out after {timeout} s")
        return None
    print(res.stdout[-12000:], flush=True)
    if res.returncode != 0:
        print(res.stderr[-6000:], flush=True)
    print(f"({name}: {time.perf_counter() - start:.0f} s)", flush=True)
    return res


def check_env() -> None:
    print("== env", flush=True)
    import torch

    if not torch.cuda.is_available():
        line("FAIL", "env: CUDA", "torch.cuda.is_available() is False")
        return
    line("PASS", "env: CUDA", f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    import transformers

    line("PASS", "env: transformers", transformers.__version__)
    for mod in ("flashinfer", "triton"):
        try:
            m = __import__(mod)
            line("PASS", f"env: {mod}", getattr(m, "__version__", "?"))
        except Exception as e:  # ImportError, or a missing dependency of flashinfer
            line("FAIL", f"env: {mod}", f"{type(e).__name__}: {e}")


def check_models(timeout: int) -> None:
    print("\n== models", flush=True)
    if not (SHAPED / "config.json").is_file():
        res = run(
            [sys.executable, "-m", "tools.models", "qwen3-0.6b-shaped"],
            timeout,
            "models: build qwen3-0.6b-shaped",
        )
        if res is None or res.returncode != 0:
            line(
                "FAIL",
                "models: qwen3-0.6b-shaped",
                "build failed (is models/qwen3-tokenizer there?)",
            )
            return
    line("PASS", "models: qwen3-0.6b-shaped", str(SHAPED))
    if (SMOLLM2 / "config.json").is_file():
        line("PASS", "models: SmolLM2-135M-Instruct", str(SMOLLM2))
    else:
        line(
            "SKIP",
            "models: SmolLM2-135M-Instruct",
            "not converted: python -m tools.models smollm2 --gguf PATH (its GPU tests will skip)",
        )


def check_tests(timeout: int) -> None:
    print("\n== tests (GPU ones only; the CPU ones run in CI)", flush=True)
    res = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-s",
            *TESTS,
        ],
        timeout,
        "tests",
    )
    if res is None:
        return
    summary = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)(?: - (.*))?$", res.stdout, re.M)
    skip_lines = re.findall(r"^SKIPPED \[\d+\] (\S+): (.*)$", res.stdout, re.M)
    for status, test, reason in summary:
        line("PASS" if status == "PASSED" else "FAIL", test, reason or "")
    for where, reason in skip_lines:
        line("SKIP", where, reason)
    if not summary and not skip_lines:
        line("FAIL", "tests", f"pytest exited {res.returncode} with no result lines")


def check_bench(timeout: int) -> None:
    print("\n== bench", flush=True)
    res = run(
        [
            sys.executable,
            "-m",
            "minisgl.benchmark.decode_step",
            "--model",
            str(SHAPED),
            "--batch-sizes",
            "1",
            "8",
            "64",
            "256",
            "--steps",
            "30",
        ],
        timeout,
        "bench: decode_step",
    )
    if res is None or res.returncode != 0:
        line("FAIL", "bench: decode_step")
    else:
        row = re.search(
            r"^\s*1 \|\s*\d+ \|\s*([\d.]+) / ([\d.]+) \|.*?\|\s*([\d.]+) \|", res.stdout, re.M
        )
        if row:
            gpu_ms, step_ms, floor_ms = map(float, row.groups())
            status = "PASS" if gpu_ms <= 0.6 else "INFO"
            line(
                status,
                "bench: batch 1 decode step <= 0.6 ms (graphs on)",
                f"GPU {gpu_ms:.3f} ms, whole step {step_ms:.3f} ms, floor {floor_ms:.3f} ms",
            )
        else:
            line("PASS", "bench: decode_step", "ran (no graphs row to read)")
    res = run(
        [
            sys.executable,
            "-m",
            "minisgl.benchmark.offline",
            "--model",
            str(SHAPED),
            "--num-seqs",
            "64",
            "--input-len",
            "100",
            "512",
            "--output-len",
            "100",
            "256",
        ],
        timeout,
        "bench: offline (64 requests)",
    )
    line(
        "PASS" if res is not None and res.returncode == 0 else "FAIL",
        "bench: offline (64 requests)",
    )


def check_full(timeout: int, flag: str) -> None:
    print(f"\n== full benchmark ({flag})", flush=True)
    res = run(
        [sys.executable, "-m", "minisgl.benchmark.offline", "--model", str(SHAPED), flag],
        timeout,
        f"full: offline {flag}",
    )
    if res is None or res.returncode != 0:
        line("FAIL", f"full: offline {flag}")
        return
    if flag != "--hf":
        line("PASS", f"full: offline {flag}")
        return
    ratios = [float(x) for x in re.findall(r"\|\s*([\d.]+)x \|", res.stdout)]
    best = max(ratios) if ratios else 0.0
    line(
        "PASS" if best >= 30 else "INFO",
        "full: mini-sglang >= 30x transformers",
        f"best ratio {best:.1f}x",
    )


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.diagnostics.gpu_check", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--only",
        choices=["env", "models", "tests", "bench", "full", "matrix"],
        action="append",
        help="run only these parts (repeatable); default: env, models, tests, bench",
    )
    p.add_argument("--timeout", type=int, default=570, help="seconds per subprocess")
    args = p.parse_args()
    parts = args.only or ["env", "models", "tests", "bench"]
    if "env" in parts:
        check_env()
    if "models" in parts or any(x in parts for x in ("tests", "bench", "full", "matrix")):
        check_models(args.timeout)
    if "tests" in parts:
        check_tests(args.timeout)
    if "bench" in parts:
        check_bench(args.timeout)
    if "full" in parts:
        check_full(args.timeout, "--hf")
    if "matrix" in parts:
        check_full(args.timeout, "--matrix")
    print(
        f"\n{len(failures)} failure(s)" + (": " + ", ".join(failures) if failures else ""),
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
