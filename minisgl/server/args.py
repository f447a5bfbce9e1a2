"""The server's settings and its command line. Mirrors upstream ``minisgl.server.args``."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import torch

from minisgl.distributed import DistributedInfo  # +ch16
from minisgl.kvcache import PREFIX_CACHES
from minisgl.layers.shard import check_tp_size  # +ch16
from minisgl.models import ModelConfig  # +ch16
from minisgl.scheduler import SchedulerConfig
from minisgl.utils import (
    cached_load_hf_config,  # +ch16
    check_model_path,
)
from minisgl.utils.device import check_device, default_device


@dataclass(frozen=True)
class ServerArgs(SchedulerConfig):
    """Scheduler settings plus where to listen and whom to serve. The API binds
    ``server_host`` (loopback by default: nothing outside this machine can reach the server
    unless asked for); ``api_key``, ``allowed_origins``, ``allowed_hosts`` and
    ``max_body_bytes`` are the ``Guard``'s; ``max_queued_requests`` is how many requests may
    wait beyond ``max_running_req``, and ``max_outstanding_tokens`` how many tokens of work
    the open requests may still owe (None: twice the KV cache's tokens; 0: no bound), before
    new ones get 429; on SIGTERM or Ctrl-C the open requests may run ``shutdown_grace_s``
    seconds more before they end with an error."""

    server_host: str = "127.0.0.1"
    server_port: int = 1919
    served_model_name: str = ""  # the ``model`` clients must name; default: the folder's name
    trace_path: str | None = None  # --trace: rank 0 records its steps there (chapter 7's recorder)
    shell: bool = False
    api_key: str = ""
    allowed_origins: Tuple[str, ...] = ()
    allowed_hosts: Tuple[str, ...] = ()
    max_body_bytes: int = 4 << 20
    max_queued_requests: int = 1024
    max_outstanding_tokens: int | None = None
    shutdown_grace_s: float = 30.0  # SIGTERM: how long open requests may run on
    # >>> ch23: requests arrive over time, so a long answer must not hold back a short one
    enable_retraction: bool = True
    # <<< ch23

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model_path).name

    @property
    def zmq_frontend_addr(self) -> str:
        """Where the API server receives replies from the tokenizer worker."""
        return self._addr("frontend")


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _port_is_free(host: str, port: int) -> bool:
    """Whether a listening socket could bind ``host:port`` now (checked before any worker
    starts: uvicorn would find out only after the model has loaded)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def preflight(args: ServerArgs) -> str | None:
    """What would make the launch fail after the workers have started, found before:
    a missing model (every worker would raise it in turn) or a port already in use
    (uvicorn finds out only once the model has loaded). None when both are fine."""
    try:
        check_model_path(args.model_path)
    except FileNotFoundError as e:
        return str(e)
    if not args.shell and not _port_is_free(args.server_host, args.server_port):
        return f"port {args.server_port} on {args.server_host} is in use: pick another with --port"
    return None


def parse_args(argv: List[str] | None, ipc_dir: str) -> ServerArgs:
    """``python -m minisgl --model PATH [--port N] [--host H] [--device cpu|cuda] [--shell] ...``.

    ``--dtype auto`` is bfloat16 on CUDA and float32 on the CPU (where bfloat16 matmuls
    are slow and the book's tests compare float32 outputs). Exits (argparse) on bad input.
    """
    p = argparse.ArgumentParser(
        prog="python -m minisgl", description="mini-sglang: an OpenAI-compatible server"
    )
    p.add_argument(
        "--model",
        "--model-path",
        dest="model_path",
        required=True,
        help="local Hugging Face folder",
    )
    p.add_argument(
        "--host",
        dest="server_host",
        default=ServerArgs.server_host,
        help="address to bind (default: loopback only)",
    )
    p.add_argument("--port", dest="server_port", type=int, default=ServerArgs.server_port)
    p.add_argument(
        "--device", default=None, help="cpu or cuda (default: MINISGL_DEVICE, else CUDA if present)"
    )
    p.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES])
    p.add_argument(
        "--served-model-name", default="", help="the model name clients send (default: folder name)"
    )
    p.add_argument(
        "--max-running-requests",
        dest="max_running_req",
        type=int,
        default=ServerArgs.max_running_req,
    )
    p.add_argument("--max-seq-len", dest="max_seq_len_override", type=int, default=None)
    p.add_argument(
        "--max-prefill-length",
        dest="max_extend_tokens",
        type=int,
        default=ServerArgs.max_extend_tokens,
    )
    p.add_argument("--num-pages", dest="num_page_override", type=int, default=None)
    p.add_argument("--page-size", type=int, default=ServerArgs.page_size)
    p.add_argument("--memory-ratio", type=float, default=ServerArgs.memory_ratio)
    p.add_argument("--attention-backend", "--attn", default=ServerArgs.attention_backend)
    # >>> ch21
    p.add_argument(
        "--moe-backend", default=ServerArgs.moe_backend, help="MoE models: torch, fused or auto"
    )
    # <<< ch21
    p.add_argument("--cache-type", choices=PREFIX_CACHES.names(), default=ServerArgs.cache_type)
    # >>> ch18
    p.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="capture decode graphs up to this batch size; 0 disables CUDA graphs (default 256)",
    )
    # <<< ch18
    p.add_argument(
        "--shell", action="store_true", help="chat in this terminal instead of serving HTTP"
    )
    p.add_argument(
        "--trace",
        dest="trace_path",
        metavar="FILE",
        default=None,
        help="record the scheduler's steps, written to FILE (JSON) when the server stops; it "
        "grows with every step and syncs the device once a step: for short sessions "
        "(view it: python -m tools.trace_view FILE)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("MINISGL_API_KEY", ""),
        help="require 'Authorization: Bearer KEY' on every route but /health "
        "(default: MINISGL_API_KEY, else none)",
    )
    p.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated origins (https://app.example) whose pages may call the API; "
        "'*' for any (default: none, cross-site requests are refused)",
    )
    p.add_argument(
        "--allowed-hosts",
        default="",
        help="comma-separated Host names accepted besides the bind address (behind a proxy)",
    )
    p.add_argument("--max-body-bytes", type=int, default=ServerArgs.max_body_bytes)
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=ServerArgs.max_queued_requests,
        help="requests waiting beyond --max-running-requests before new ones get 429",
    )
    p.add_argument(
        "--max-outstanding-tokens",
        type=int,
        default=None,
        help="tokens of work the open requests may still cost (prompts not yet read plus "
        "output still allowed) before new ones get 429 (default: twice the KV cache's "
        "tokens; 0: no bound)",
    )
    p.add_argument(
        "--shutdown-grace",
        dest="shutdown_grace_s",
        type=float,
        default=ServerArgs.shutdown_grace_s,
        help="seconds that open requests may run on after SIGTERM or Ctrl-C before each ends "
        "with an error (no new request is admitted meanwhile)",
    )
    # >>> ch23
    p.add_argument(
        "--disable-retraction",
        dest="enable_retraction",
        action="store_false",
        help="admit as chapter 7 does, reserving each request's whole output budget (by "
        "default the server admits on an estimate and retracts when KV pages run out, so "
        "long answers cannot starve short ones)",
    )
    # <<< ch23
    # >>> ch24
    p.add_argument(
        "--grammar-timeout",
        dest="grammar_timeout_s",
        type=float,
        default=ServerArgs.grammar_timeout_s,
        help="seconds a request's JSON schema, regex or grammar may take to compile; a "
        "slower one is answered with a 400",
    )
    # <<< ch24
    # >>> ch16
    p.add_argument(
        "--tp",
        "--tp-size",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=1,
        help="tensor-parallel ranks: one scheduler process (and GPU) each",
    )
    # <<< ch16
    ns = vars(p.parse_args(argv))
    name = ns.pop("device")
    try:
        device = str(check_device(name, "--device") if name else default_device())
    except ValueError as e:
        p.error(str(e))
    # >>> ch18
    if ns["cuda_graph_max_bs"] is not None and ns["cuda_graph_max_bs"] < 0:
        p.error(
            f"--cuda-graph-max-bs must be >= 0 (0 disables CUDA graphs), got {ns['cuda_graph_max_bs']}"
        )
    # <<< ch18
    # >>> ch16: refuse a rank count the heads cannot be split over, before any process starts
    tp_size = ns.pop("tp_size")
    if tp_size != 1:
        try:
            mc = ModelConfig.from_hf(cached_load_hf_config(ns["model_path"]))
            check_tp_size(mc.num_qo_heads, mc.num_kv_heads, mc.intermediate_size, tp_size)
        except (OSError, ValueError) as e:
            p.error(str(e))
    # <<< ch16
    for key in ("allowed_origins", "allowed_hosts"):
        ns[key] = tuple(x.strip() for x in ns[key].split(",") if x.strip())
    if ns["max_body_bytes"] < 1 or ns["max_queued_requests"] < 0:
        p.error("--max-body-bytes must be >= 1 and --max-queued-requests >= 0")
    if (ns["max_outstanding_tokens"] or 0) < 0:
        p.error("--max-outstanding-tokens must be >= 0")
    if not 0 <= ns["shutdown_grace_s"] < float("inf"):
        p.error("--shutdown-grace must be a number of seconds >= 0")
    dtype = ns.pop("dtype")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    if ns["shell"]:
        ns["max_running_req"] = min(ns["max_running_req"], 4)  # one user: keep the pool small
    return ServerArgs(
        **ns,
        device=device,
        dtype=_DTYPES[dtype],
        ipc_dir=ipc_dir,
        # >>> ch16: the ranks meet at a file in the launch's private directory: no port to pick
        tp_info=DistributedInfo(0, tp_size),
        distributed_addr=f"file://{ipc_dir}/distributed",
        # <<< ch16
    )
