# SPDX-License-Identifier: Apache-2.0
"""Turn ``{"method": "logitspec" | "echo", ...}`` into a vLLM ``custom_class`` config.

vLLM's ``SpeculativeConfig.method`` is a closed Literal and the config forbids
extra keys, so our methods cannot reach it as they are. Before vLLM builds the
``SpeculativeConfig`` we rewrite the dict: ``method="custom_class"``, ``model`` =
our proposer class, and our own keys move into ``additional_config`` (pickled to
every process, Ray workers on other nodes included).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_echo.config import (ADDITIONAL_CONFIG_KEY, DEFAULT_NUM_SPECULATIVE_TOKENS, METHODS,
                              VLLM_PASSTHROUGH_KEYS, EchoSettings, SpeculativeConfigError)

logger = logging.getLogger("vllm.vllm_echo")

# On a CPU every verified token is compute and each root path off a tree's first
# branch costs another kernel call over the context (the native tree path costs 7-31%
# over a chain of the same size): trees pay where answers copy the prompt and lose
# where they don't, so both methods verify one chain per request there unless the user
# asks for trees ("tree": true or a "capacity"); trees asked for without a capacity get
# the smallest that paid (benchmarks/journal/echo-cpu.md). GPUs keep the reference trees of
# capacity 64.
CPU_LOGITSPEC_CAPACITY = 8
# ECHO sizes its drafts itself: on the CPU it picks each request's best root path of a
# 32-node forest (long chains only where answers copy the prompt), never 64-node
# forests, whose drafting and planning would be work for nothing.
CPU_ECHO_CAPACITY = 32
# Tree attention on the CPU when the user names none ("tree_attention"); CUDA has
# only "flex".
CPU_TREE_ATTENTION = "native"


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


PROPOSER_CLASSES = {
    "logitspec": "vllm_echo.plugin.proposers.logitspec.LogitSpecProposer",
    "echo": "vllm_echo.plugin.proposers.echo.EchoProposer",
}


def is_our_method(spec: Any) -> bool:
    return isinstance(spec, dict) and spec.get("method") in METHODS


def rewrite(spec: dict[str, Any], additional_config: dict[str, Any] | None,
            model_config: Any = None, parallel_config: Any = None
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(vllm_spec, additional_config)`` for one of our methods.

    ``model_config``/``parallel_config`` are the target's (None skips the checks
    that need them). Raises SpeculativeConfigError naming the key, the value and
    what is allowed.
    """
    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    method = spec["method"]
    if "model" in spec:
        raise SpeculativeConfigError(
            f"speculative_config: key 'model' is not used by method {method!r} "
            "(the target model drafts for itself); remove it")
    _check_passthrough(spec)
    vllm_spec = {k: spec[k] for k in VLLM_PASSTHROUGH_KEYS if k in spec}
    ours = {k: v for k, v in spec.items() if k not in VLLM_PASSTHROUGH_KEYS}
    on_cpu = _on_cpu()
    if "capacity" not in ours and on_cpu:
        if "tree" not in ours:
            ours["tree"] = False
        ours["capacity"] = CPU_LOGITSPEC_CAPACITY if method == "logitspec" else CPU_ECHO_CAPACITY
    settings = EchoSettings.from_dict(ours)
    if settings.tree_attention is None:
        ours["tree_attention"] = CPU_TREE_ATTENTION if on_cpu else "flex"
    elif settings.tree_attention == "native" and not on_cpu:
        raise SpeculativeConfigError(
            "speculative_config: tree_attention='native' is the CPU backend's tree path; "
            "allowed here: 'flex' (with --attention-backend FLEX_ATTENTION)")
    _check_model(method, model_config)
    _check_parallel(method, parallel_config)
    if settings.tree:
        chain_only = _chain_only_reason(model_config)
        if chain_only is not None:
            if "tree" in ours:
                raise SpeculativeConfigError(
                    f"speculative_config: tree=true is not supported with {chain_only}; "
                    "allowed: tree=false")
            logger.warning("vllm-echo: %s cannot verify token trees; method %r verifies "
                           "one chain per request.", chain_only, method)
            ours["tree"] = False
    if "num_speculative_tokens" in spec:
        k_drafts = spec["num_speculative_tokens"]
    else:  # trees, and ECHO, which sizes its drafts: the forest; LogitSpec chains: short
        tree = ours.get("tree", True)
        k_drafts = (settings.capacity - 1 if tree or method == "echo"
                    else DEFAULT_NUM_SPECULATIVE_TOKENS)
    settings = EchoSettings.from_dict({**ours, "num_speculative_tokens": k_drafts})
    vocab_size = _vocab_size(model_config)
    if vocab_size is not None:
        settings.check_vocab(vocab_size)
    vllm_spec.update(method="custom_class", model=PROPOSER_CLASSES[settings.method],
                     num_speculative_tokens=settings.max_drafts)
    merged = dict(additional_config or {})
    merged[ADDITIONAL_CONFIG_KEY] = settings.to_dict()
    return vllm_spec, merged


def _check_passthrough(spec: dict[str, Any]) -> None:
    """vLLM's own keys, checked here so that their errors are one line too."""
    for name, low in (("max_model_len", 1), ("disable_by_batch_size", 2)):
        value = spec.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):
            raise SpeculativeConfigError(
                f"speculative_config: {name}={value!r} is invalid; allowed: an integer >= {low}")
    value = spec.get("disable_log_stats")
    if value is not None and not isinstance(value, bool):
        raise SpeculativeConfigError(
            f"speculative_config: disable_log_stats={value!r} is invalid; allowed: true or false")


def _check_model(method: str, model_config: Any) -> None:
    """Models no vllm-echo method can draft for."""
    if model_config is None:
        return
    runner = getattr(model_config, "runner_type", "generate")
    if runner != "generate":
        raise SpeculativeConfigError(
            f"speculative_config: method {method!r} needs a generative model; this model "
            f"runs as {runner!r}; allowed: 'generate'")
    for flag, what in (("is_encoder_decoder", "encoder-decoder"),
                       ("is_attention_free", "attention-free")):
        if getattr(model_config, flag, False):
            raise SpeculativeConfigError(
                f"speculative_config: method {method!r} does not support {what} models "
                f"({', '.join(getattr(model_config, 'architectures', None) or [])}); "
                "allowed: decoder-only models with attention")


def _chain_only_reason(model_config: Any) -> str | None:
    """Set-ups whose drafts can only be verified as chains, or None."""
    if model_config is not None and getattr(model_config, "is_hybrid", False):
        # A tree's nodes would advance the recurrent state one after another.
        return "hybrid (recurrent-state) models"
    return None


def _check_parallel(method: str, parallel_config: Any) -> None:
    """vLLM 0.32's model runner creates the drafter on the last pipeline stage only, and
    its KV-cache setup then reads ``self.drafter`` on every stage
    (gpu_model_runner.py:590, :7017): with pipeline parallelism any speculative method,
    vLLM's ngram included, dies in the workers with an AttributeError. Refused here with
    one line instead. Remove when vLLM's KV-cache setup tolerates stages without a
    drafter (tree_support.prepare then keeps such engines in chain mode)."""
    size = getattr(parallel_config, "pipeline_parallel_size", 1) if parallel_config else 1
    if size > 1:
        raise SpeculativeConfigError(
            f"speculative_config: method {method!r} does not support pipeline parallelism "
            f"(pipeline_parallel_size={size}): vLLM's workers fail at KV-cache setup with "
            "any speculative method; allowed: pipeline_parallel_size=1 (tensor "
            "parallelism is supported)")


def refuse_unsupported_engine(vllm_config: Any) -> None:
    """Engine features our tree verification cannot coexist with, checked on the final
    config rather than assumed off.

    - Async scheduling overlaps the next schedule with this step's sampling, but KV
      compaction and the next-next top-k capture must finish before the next step is
      scheduled. vLLM turns it off for custom_class proposers today.
    - A KV connector saves or sends a request's KV as the step computes it, before
      compaction moves an accepted tree path into place.
    """
    method = vllm_config.additional_config[ADDITIONAL_CONFIG_KEY]["method"]
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise SpeculativeConfigError(
            f"speculative_config: method {method!r} does not support async scheduling; "
            "allowed: async_scheduling off (drop --async-scheduling)")
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise SpeculativeConfigError(
            f"speculative_config: method {method!r} does not support KV connectors "
            "(kv_transfer_config); allowed: no KV connector")


def _vocab_size(model_config: Any) -> int | None:
    try:
        return int(model_config.get_vocab_size())
    except Exception:  # the vocabulary check is a convenience; vLLM validates the rest
        return None


def settings_from_vllm_config(vllm_config: Any, method: str) -> EchoSettings:
    """Read our settings back in any process (engine core, workers, Ray actors)."""
    extra = (getattr(vllm_config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY)
    if extra is None:
        # Direct use of {"method": "custom_class", "model": "vllm_echo...."}: defaults,
        # with K taken from vLLM's own config.
        k = vllm_config.speculative_config.num_speculative_tokens
        return EchoSettings(method=method, num_speculative_tokens=k)
    return EchoSettings.from_dict(extra)
