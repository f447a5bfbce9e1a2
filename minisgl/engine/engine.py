"""The engine: one model, its KV pool and page table, and one forward pass per call.

The engine knows nothing about requests arriving or finishing; the scheduler hands it a
prepared ``Batch`` and gets the next token of each request back. Start-up is the
interesting part: load the weights, then size the KV pool from what memory is left.
``startup_seconds`` says where start-up went. Mirrors upstream ``minisgl.engine.engine.Engine``.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from minisgl.attention import create_attention_backend, resolve_attention_backend
from minisgl.core import (
    Batch,
    Context,
    Req,  # +ch18
    SamplingParams,  # +ch18
    set_global_ctx,
)
from minisgl.distributed import (
    destroy_distributed,  # +ch16
    get_tp_info,
    init_distributed,  # +ch16
    set_tp_info,  # +ch16
)
from minisgl.kernel import has_kernel  # +ch19
from minisgl.kvcache import create_kvcache_pool
from minisgl.layers.shard import check_tp_size  # +ch16
from minisgl.models import BaseLLMModel, create_model, load_weight
from minisgl.utils import align_up, div_even, init_logger, torch_dtype
from minisgl.utils.device import (
    Event,
    check_device,
    create_event,
    create_stream,
    default_device,
    get_free_memory,
    is_cuda,
    set_stream,
    synchronize,
)

from .config import DEFAULT_CPU_KV_MEMORY, EngineConfig
from .graph import GraphRunner, determine_graph_bs  # +ch18
from .sample import BatchSamplingArgs, LogprobOutput, Sampler

logger = init_logger(__name__)


class ForwardOutput(NamedTuple):
    next_tokens_gpu: torch.Tensor  # [B] int32 on the engine's device
    next_tokens_cpu: torch.Tensor  # [B] int32, valid once copy_done_event has completed
    copy_done_event: Event
    logprobs: LogprobOutput | None = None  # on the CPU; only when a request asked


class Engine:
    """One model, its KV pool and page table, an attention backend and a sampler.
    ``__init__`` builds them in the order each needs the one before; ``startup_seconds`` says
    where the time went."""

    def __init__(self, config: EngineConfig) -> None:
        t0 = time.perf_counter()
        self.config = config
        self._init_device_and_ranks()
        free_before = get_free_memory(self.device) if is_cuda(self.device) else 0
        self.model = self._load_model()
        self.startup_seconds = {"load": time.perf_counter() - t0}
        t = time.perf_counter()
        self._init_kv_cache(self._determine_num_pages(free_before))
        backend = resolve_attention_backend(config.attention_backend, self.device, self.dtype)
        self.ctx.attn_backend = self.attn_backend = create_attention_backend(
            backend, config.model_config
        )
        self.model = self._fuse_decode(self.model)  # +ch19
        self.sampler = Sampler(self.device, config.model_config.vocab_size, config.seed)
        self.startup_seconds["kv_cache"] = time.perf_counter() - t
        # >>> ch17: kernels compiled now, not in the first sampled request
        t = time.perf_counter()
        if is_cuda(self.device):
            self.sampler.warm_up(self.dtype)
        self.startup_seconds["jit_warmup"] = time.perf_counter() - t
        # <<< ch17
        # >>> ch18
        self.graph_runner = self._capture_graphs()
        self.startup_seconds["jit_warmup"] += self.graph_runner.warmup_seconds
        capture = self.graph_runner.capture_seconds - self.graph_runner.warmup_seconds
        self.startup_seconds["graph_capture"] = capture
        # <<< ch18
        self.startup_seconds["total"] = time.perf_counter() - t0
        logger.info_rank0(f"engine ready on {self.device} in {self.startup_seconds['total']:.1f} s")

    # ---- start-up, step by step -------------------------------------------------------------
    def _init_device_and_ranks(self) -> None:
        """The device, the engine's stream and the global context every layer reads."""
        config = self.config
        self.device = check_device(config.device) if config.device else default_device()
        # >>> ch16: rank r uses GPU r; with several ranks, this blocks until all have joined
        if is_cuda(self.device) and self.device.index is None:
            self.device = torch.device("cuda", config.tp_info.rank)
        # <<< ch16
        if is_cuda(self.device):
            torch.cuda.set_device(self.device)
        # >>> ch16
        mc = config.model_config
        set_tp_info(config.tp_info.rank, config.tp_info.size)
        check_tp_size(mc.num_qo_heads, mc.num_kv_heads, mc.intermediate_size, config.tp_info.size)
        self.tp_cpu_group = init_distributed(
            config.tp_info, self.device, config.distributed_addr, config.distributed_timeout
        )
        # <<< ch16
        torch.manual_seed(config.seed)
        self.stream = create_stream(self.device)
        set_stream(self.stream)
        self.dtype = config.dtype
        self.ctx = Context(config.page_size)
        set_global_ctx(self.ctx)

    def _load_model(self) -> BaseLLMModel:
        """Build the model on the meta device (no memory), then swap in the loaded weights."""
        mc = self.config.model_config
        with torch.device("meta"), torch_dtype(self.dtype):
            model = create_model(mc)
        weights = load_weight(self.config.model_path, self.device, self.dtype)
        # >>> ch21: stacked experts, and the backend that runs them
        if mc.is_moe:
            from minisgl.models.moe_weight import stack_experts
            from minisgl.moe import create_moe_backend

            weights = stack_experts(weights, mc.num_experts)
            self.ctx.moe_backend = create_moe_backend(self.config.moe_backend, self.device)
        # <<< ch21
        model.load_state_dict(dict(weights))
        synchronize(self.device)
        return model

    def _init_kv_cache(self, num_pages: int) -> None:
        """The KV pool and the page table."""
        config = self.config
        self.num_pages = num_pages
        num_tokens = num_pages * config.page_size
        self.max_seq_len = min(config.max_seq_len, num_tokens)
        if self.max_seq_len < config.max_seq_len:  # said, not silently served
            logger.warning_rank0(
                f"the context is {self.max_seq_len} tokens, not {config.max_seq_len}: "
                f"that is all the KV cache holds ({num_pages} pages of {config.page_size})"
            )
        rows, pool_pages = config.max_running_req, num_pages
        # >>> ch18: one more page and one more row, for the dummy request of CUDA graphs
        rows, pool_pages = rows + 1, pool_pages + 1
        # <<< ch18
        self.ctx.kv_cache = self.kv_cache = create_kvcache_pool(
            config.model_config, pool_pages, config.page_size, self.device, self.dtype
        )
        # columns rounded to 32 so rows stay 128-byte aligned
        self.ctx.page_table = self.page_table = torch.zeros(
            (rows, align_up(self.max_seq_len, 32)), dtype=torch.int32, device=self.device
        )
        # >>> ch18: the dummy request that pads a decode batch to a captured size
        self.dummy_req = Req(
            input_ids=torch.tensor([0], dtype=torch.int32),
            table_idx=config.max_running_req,
            cached_len=0,
            output_len=1,
            uid=-1,
            sampling_params=SamplingParams(),
        )
        self.page_table[self.dummy_req.table_idx].fill_(num_tokens)  # the dummy page
        # <<< ch18

    # >>> ch19
    def _fuse_decode(self, model: BaseLLMModel) -> BaseLLMModel:
        """The model wrapped for the fused decode path (``models/fused_decode.py``) where its
        Triton kernels run; any other model is returned as is."""
        if not has_kernel("norm_linear", "triton", self.device):
            return model
        from minisgl.models.fused_decode import FusedDecodeLM, fusable

        return FusedDecodeLM(model) if fusable(model) else model

    # <<< ch19
    # >>> ch18
    def _capture_graphs(self) -> GraphRunner:
        """The decode CUDA graphs: CUDA, and a backend that can be replayed."""
        graph_bs: list[int] = []
        replayable = is_cuda(self.device) and self.attn_backend.supports_cuda_graph
        # >>> ch21
        if self.config.model_config.is_moe:
            replayable &= self.ctx.moe_backend.supports_cuda_graph
        # <<< ch21
        if replayable:
            graph_bs = determine_graph_bs(
                self.config.cuda_graph_bs,
                self.config.cuda_graph_max_bs,
                self.config.max_running_req,
            )
        stream = self.stream if is_cuda(self.device) else None
        return GraphRunner(
            self.model,
            self.attn_backend,
            stream,  # type: ignore[arg-type]
            self.device,
            self.dummy_req,
            graph_bs,
            self.page_table.shape[1],
        )

    # <<< ch18
    def _determine_num_pages(self, free_before: int) -> int:
        """Pages of KV the pool gets, printed with the memory they take.

        Raises:
            ValueError: when not even two pages fit.
        """
        cfg, mc = self.config, self.config.model_config
        kv_heads = div_even(mc.num_kv_heads, get_tp_info().size, allow_replicate=True)
        bytes_per_page = (
            2 * mc.num_layers * cfg.page_size * kv_heads * mc.head_dim * self.dtype.itemsize
        )
        if cfg.num_page_override is not None:
            num_pages, how = cfg.num_page_override, "num_page_override"
        elif cfg.kv_memory_cap is not None:
            num_pages, how = (
                cfg.kv_memory_cap // bytes_per_page,
                f"kv_memory_cap={cfg.kv_memory_cap / 2**20:.0f} MiB",
            )
        elif is_cuda(self.device):
            weights = free_before - get_free_memory(self.device)
            budget = int(cfg.memory_ratio * free_before) - weights
            num_pages, how = budget // bytes_per_page, f"{cfg.memory_ratio:.0%} of free GPU memory"
        else:
            num_pages = DEFAULT_CPU_KV_MEMORY // bytes_per_page
            how = f"the CPU default of {DEFAULT_CPU_KV_MEMORY / 2**20:.0f} MiB"
        # >>> ch16: every rank must schedule the same batches, so all get the smallest pool
        if self.tp_cpu_group is not None:
            agreed = torch.tensor([num_pages], dtype=torch.int64)
            torch.distributed.all_reduce(
                agreed, op=torch.distributed.ReduceOp.MIN, group=self.tp_cpu_group
            )
            num_pages = int(agreed.item())
        # <<< ch16
        if num_pages < 2:
            raise ValueError(f"not enough memory for the KV cache ({num_pages} pages from {how})")
        logger.info_rank0(
            f"KV cache: {num_pages} pages x {cfg.page_size} tokens = {num_pages * cfg.page_size} tokens, "
            f"{num_pages * bytes_per_page / 2**20:.1f} MiB ({how})"
        )
        return num_pages

    def forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        """Run the model on a prepared batch and sample one token per request.

        Every request's ``complete_one`` is called: its fed tokens are now cached and the
        sampled token will sit at the old ``device_len``. The CPU copy of the tokens is
        started without waiting; wait on ``copy_done_event`` before reading it (and the
        ``logprobs`` of the rows that asked for them).
        """
        with self.ctx.forward_batch(batch):
            # >>> ch18: a decode batch of a captured size is a graph replay
            if self.graph_runner.can_use_cuda_graph(batch):
                logits = self.graph_runner.replay(batch)
            else:
                logits = self.model.forward()
            # <<< ch18
            # >>> ch06-ch17
            # logits = self.model.forward()
            # <<< ch06-ch17
        for req in batch.reqs:
            req.complete_one()
        tokens = self.sampler.sample(logits[: batch.size], args)
        logprobs = self.sampler.logprobs(logits[: batch.size], tokens, args)
        next_tokens_gpu = tokens.to(torch.int32)
        next_tokens_cpu = next_tokens_gpu.to("cpu", non_blocking=True)
        logprobs_cpu = None if logprobs is None else logprobs.to_cpu()
        copy_done = create_event(self.device)
        copy_done.record(self.stream)
        return ForwardOutput(next_tokens_gpu, next_tokens_cpu, copy_done, logprobs_cpu)

    def shutdown(self) -> None:
        synchronize(self.device)
        self.graph_runner.destroy()  # +ch18
        set_global_ctx(None)
        destroy_distributed()  # +ch16
