# SPDX-License-Identifier: Apache-2.0
"""Where tree verification is available, decided once per worker.

Trees need a per-request attention mask, which only our CPU_ATTN subclass
provides so far (vllm_echo/plugin/cpu_tree_attention.py). Anything else — a GPU
backend, a model feature the torch tree path does not implement, an unknown KV
packing — keeps the proposer in chain mode, said once in the log.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_TREE_BACKEND = "vllm_echo.plugin.cpu_tree_attention.TreeCPUAttentionBackend"
_attention_layers: list[Any] = []
_layout_checked: dict[str, bool] = {}


def _chain_mode(reason: str) -> bool:
    logger.warning("vllm-echo: tree verification unavailable (%s); using chain mode.", reason)
    return False


def prepare(vllm_config: Any) -> bool:
    """Called from the proposer's __init__, before the model (and its attention
    layers) is built: route CPU_ATTN through the tree-capable subclass."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return _chain_mode(f"no tree attention for platform {current_platform.device_name!r} "
                           "in this release")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return _chain_mode("pipeline parallel > 1")
    model_config = vllm_config.model_config
    if getattr(model_config, "uses_mrope", False):
        return _chain_mode("M-RoPE positions")
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, _TREE_BACKEND)
    return True


def check_model(model: Any) -> bool:
    """Called from load_model: every decoder attention layer must be ours and use only
    what the torch tree path implements."""
    from vllm.model_executor.layers.attention.attention import Attention

    from vllm_echo.plugin.cpu_tree_attention import TreeCPUAttentionImpl

    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        return _chain_mode("no attention layers found")
    for layer in layers:
        impl = layer.impl
        if not isinstance(impl, TreeCPUAttentionImpl):
            return _chain_mode(f"attention impl {type(impl).__name__} is not tree-capable")
        if (impl.sliding_window not in (None, -1) or impl.alibi_slopes is not None
                or impl.logits_soft_cap or impl.sinks is not None):
            return _chain_mode("sliding window / ALiBi / soft-cap / sinks attention")
        if impl.kv_cache_dtype != "auto":
            return _chain_mode(f"quantized KV cache ({impl.kv_cache_dtype})")
    _attention_layers[:] = layers
    return True


def layout_ok() -> bool:
    """After the KV cache exists: the cache packing of the layers' ISA must decode."""
    from vllm_echo.plugin.cpu_tree_attention import probe_layout

    layer = _attention_layers[0]
    isa = getattr(layer, "isa", None)
    if isa not in _layout_checked:
        kv = layer.kv_cache[0] if isinstance(layer.kv_cache, list) else layer.kv_cache
        _layout_checked[isa] = probe_layout(isa, kv.dtype, layer.impl.num_kv_heads,
                                            layer.impl.head_size, kv.shape[2])
        if not _layout_checked[isa]:
            _chain_mode(f"unverified KV cache layout for CPU attention ISA {isa!r}")
    return _layout_checked[isa]


def compactor() -> Callable:
    from vllm_echo.plugin.cpu_tree_attention import compact_accepted_path

    return compact_accepted_path
