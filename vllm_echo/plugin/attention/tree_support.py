# SPDX-License-Identifier: Apache-2.0
"""Where tree verification is available, decided once per engine worker.

Trees need a per-request attention mask. Two backends provide one, chosen by the
``tree_attention`` setting: "native", on CPU only, our CPU_ATTN subclass
(attention/cpu_tree_attention.py); "flex", vLLM's FLEX_ATTENTION with our mask
ANDed in (attention/flex_tree_attention.py), on CUDA selected by the user with
``--attention-backend FLEX_ATTENTION`` in eager mode, on CPU put in CPU_ATTN's place
(cpu_flex_attention.py). Anything else — another GPU backend, CUDA graphs, a model
feature the tree path does not implement, an unknown KV packing — keeps the proposer
in chain mode, said once in the log. What is decided is kept in the engine's
TreeContext (tree_state.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from vllm_echo.plugin.runner.tree_state import TreeContext

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_CPU_BACKENDS = {
    "native": "vllm_echo.plugin.attention.cpu_tree_attention.TreeCPUAttentionBackend",
    "flex": "vllm_echo.plugin.attention.cpu_flex_attention.CPUFlexAttentionBackend",
}
# Private attributes of vLLM's Attention layer that capture and compaction read.
_LAYER_ATTRIBUTES = ("layer_name", "kv_cache", "_k_scale_float", "_v_scale_float")


def _chain_mode(reason: str) -> bool:
    logger.warning("vllm-echo: tree verification unavailable (%s); using chain mode.", reason)
    return False


def prepare(tree_context: TreeContext, vllm_config: Any, tree_attention: str | None,
            runner: Any) -> bool:
    """Called from the proposer's __init__ (inside the runner's), before the model and
    its attention layers are built. CPU: route CPU_ATTN through the tree-capable
    subclass (``tree_attention`` "native") or through FLEX_ATTENTION ("flex") while
    ``runner`` loads its model. Flex, on CPU or CUDA: add the tree mask to
    FLEX_ATTENTION."""
    from vllm.platforms import current_platform

    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return _chain_mode("pipeline parallel > 1")
    model_config = vllm_config.model_config
    if getattr(model_config, "uses_mrope", False):
        return _chain_mode("M-RoPE positions")
    on_cpu = current_platform.is_cpu()
    if not on_cpu and not current_platform.is_cuda():
        return _chain_mode(f"no tree attention for platform {current_platform.device_name!r}")
    flex = tree_attention == "flex" or not on_cpu
    if not on_cpu and not getattr(model_config, "enforce_eager", False):
        return _chain_mode("tree verification on CUDA runs in eager mode only "
                           "(enforce_eager=True / --enforce-eager)")
    if flex:
        from vllm_echo.plugin.attention.flex_tree_attention import install_flex_tree_mask

        reason = install_flex_tree_mask()  # inert unless the layers are FLEX_ATTENTION
        if reason is not None:
            return _chain_mode(reason)
    if on_cpu:
        reason = _route_cpu_attention_while_loading(
            runner, tree_context, _CPU_BACKENDS["flex" if flex else "native"])
        if reason is not None:
            return _chain_mode(reason)
    tree_context.attention.mode = "flex" if flex else "cpu"
    return True


def _route_cpu_attention_while_loading(runner: Any, tree_context: TreeContext,
                                       class_path: str) -> str | None:
    """The CPU platform always picks CPU_ATTN: load ``class_path`` under that name
    exactly while ``runner.load_model`` runs (an instance attribute wraps it), so an
    engine that fails to start leaves no override behind. Returns why it cannot
    (None: wrapped). A registry call that fails when the model loads puts the engine
    in chain mode (``tree_context.attention.mode`` None) with one log line."""
    original = getattr(runner, "load_model", None)
    if not callable(original):
        return "the model runner has no load_model"

    def load_model(*args, **kwargs):
        try:
            _register_cpu_backend(tree_context, class_path)
        except Exception as exc:  # the registry changed: vLLM's own backend, chains
            tree_context.attention.mode = None
            _chain_mode(f"cannot route CPU_ATTN to the tree backend ({type(exc).__name__}: "
                        f"{exc})")
        try:
            return original(*args, **kwargs)
        finally:
            end_cpu_route(tree_context)

    runner.load_model = load_model
    return None


def _register_cpu_backend(tree_context: TreeContext, class_path: str) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    backend = AttentionBackendEnum.CPU_ATTN
    previous = backend.get_path() if backend.is_overridden() else None

    def restore() -> None:
        if previous is None:
            backend.clear_override()
        else:
            register_backend(backend, previous)
        _forget_selected_backends()

    register_backend(backend, class_path)
    tree_context.attention.restore_cpu_backend = restore
    _forget_selected_backends()


def end_cpu_route(tree_context: TreeContext) -> None:
    """Put back what CPU_ATTN loaded before, once the model is built (the proposer's
    load_model) or its build failed: later engines in this process get the backend
    they would have had without this one. A failure to restore is logged, not raised."""
    attention = tree_context.attention
    restore, attention.restore_cpu_backend = attention.restore_cpu_backend, None
    if restore is not None:
        try:
            restore()
        except Exception as exc:
            logger.warning("vllm-echo: could not restore vLLM's CPU_ATTN backend (%s: %s); "
                           "engines started later in this process may get the tree "
                           "backend, which without trees is plain CPU attention.",
                           type(exc).__name__, exc)


def _forget_selected_backends() -> None:
    """vLLM caches its backend choice per process; an engine built in a process where
    another one already chose would get that choice, whatever the override says."""
    from vllm.v1.attention import selector

    cached = getattr(selector, "_cached_get_attn_backend", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


def check_model(tree_context: TreeContext, model: Any) -> bool:
    """Called from load_model: every decoder attention layer must be ours and use only
    what the torch tree path implements. On CPU each impl is then tied to the
    engine's context, from which it reads the step in flight."""
    from vllm.model_executor.layers.attention.attention import Attention

    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        return _chain_mode("no attention layers found")
    tree_impl = _tree_impl_class(tree_context)
    for layer in layers:
        impl = layer.impl
        if not isinstance(impl, tree_impl):
            hint = " (start vLLM with --attention-backend FLEX_ATTENTION)" \
                if tree_context.attention.compacts_by_slot else ""
            return _chain_mode(f"attention impl {type(impl).__name__} is not tree-capable{hint}")
        if (getattr(impl, "sliding_window", None) not in (None, -1)
                or getattr(impl, "alibi_slopes", None) is not None
                or getattr(impl, "logits_soft_cap", None)
                or getattr(impl, "sinks", None) is not None):
            return _chain_mode("sliding window / ALiBi / soft-cap / sinks attention")
        if impl.kv_cache_dtype != "auto":
            return _chain_mode(f"quantized KV cache ({impl.kv_cache_dtype})")
        missing = [a for a in _LAYER_ATTRIBUTES if not hasattr(layer, a)]
        if missing:
            return _chain_mode(f"attention layer has no {', '.join(missing)}")
    tree_context.attention.layers = layers
    if not tree_context.attention.compacts_by_slot:
        for layer in layers:
            layer.impl.tree_context = tree_context
    return True


def _tree_impl_class(tree_context: TreeContext) -> type:
    if tree_context.attention.compacts_by_slot:
        from vllm.v1.attention.backends.flex_attention import FlexAttentionImpl

        return FlexAttentionImpl
    from vllm_echo.plugin.attention.cpu_tree_attention import TreeCPUAttentionImpl

    return TreeCPUAttentionImpl


def compactor(tree_context: TreeContext) -> Callable:
    """The KV compaction for the engine's backend, looked up here (load_model), so a
    module function replaced before (tests/vllm/flaky_proposer.py) is the one used."""
    if tree_context.attention.compacts_by_slot:
        from vllm_echo.plugin.attention.flex_tree_attention import compact_accepted_path
    else:
        from vllm_echo.plugin.attention.cpu_tree_attention import compact_accepted_path
    return compact_accepted_path
