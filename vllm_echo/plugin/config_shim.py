# SPDX-License-Identifier: Apache-2.0
"""Turn ``{"method": "logitspec" | "echo", ...}`` into a vLLM ``custom_class`` config.

vLLM's ``SpeculativeConfig.method`` is a closed Literal and the config forbids
extra keys, so our methods cannot reach it as they are. Before vLLM builds the
``SpeculativeConfig`` we rewrite the dict: ``method="custom_class"``, ``model`` =
our proposer class, and our own keys move into ``additional_config`` (pickled to
every process, Ray workers on other nodes included).
"""

from __future__ import annotations

from typing import Any

from vllm_echo.config import (ADDITIONAL_CONFIG_KEY, DEFAULT_NUM_SPECULATIVE_TOKENS, METHODS,
                              VLLM_PASSTHROUGH_KEYS, EchoSettings)

# On a CPU every verified token is compute: measured on the embedded model (batch 1,
# fp32), a tree of capacity 8 / 16 / 32 / 64 ran at 0.98 / 0.81 / 0.47 / 0.35x the
# speed of no speculation, so plain LogitSpec trees default to the smallest there
# (ECHO sizes its trees from the measured cost instead). GPUs keep the reference 64.
CPU_LOGITSPEC_CAPACITY = 8


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


PROPOSER_CLASSES = {
    "logitspec": "vllm_echo.plugin.proposer.LogitSpecProposer",
    "echo": "vllm_echo.plugin.echo_proposer.EchoProposer",
}


def is_our_method(spec: Any) -> bool:
    return isinstance(spec, dict) and spec.get("method") in METHODS


def rewrite(spec: dict[str, Any], additional_config: dict[str, Any] | None,
            vocab_size: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(vllm_spec, additional_config)`` for one of our methods.

    Raises ValueError naming the key, the value and what is allowed.
    """
    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    if "model" in spec:
        raise ValueError(
            f"speculative_config: key 'model' is not used by method {spec['method']!r} "
            "(the target model drafts for itself); remove it")
    vllm_spec = {k: spec[k] for k in VLLM_PASSTHROUGH_KEYS if k in spec}
    ours = {k: v for k, v in spec.items() if k not in VLLM_PASSTHROUGH_KEYS}
    if (ours.get("method") == "logitspec" and "capacity" not in ours
            and _on_cpu()):
        ours["capacity"] = CPU_LOGITSPEC_CAPACITY
    settings = EchoSettings.from_dict(ours)
    if "num_speculative_tokens" in spec:
        k_drafts = spec["num_speculative_tokens"]
    else:  # tree mode: room for the whole forest; chain mode: a short chain
        k_drafts = settings.capacity - 1 if settings.tree else DEFAULT_NUM_SPECULATIVE_TOKENS
    settings = EchoSettings.from_dict({**ours, "num_speculative_tokens": k_drafts})
    if vocab_size is not None:
        settings.check_vocab(vocab_size)
    vllm_spec.update(method="custom_class", model=PROPOSER_CLASSES[settings.method],
                     num_speculative_tokens=settings.max_drafts)
    merged = dict(additional_config or {})
    merged[ADDITIONAL_CONFIG_KEY] = settings.to_dict()
    return vllm_spec, merged


def settings_from_vllm_config(vllm_config: Any, method: str) -> EchoSettings:
    """Read our settings back in any process (engine core, workers, Ray actors)."""
    extra = (getattr(vllm_config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY)
    if extra is None:
        # Direct use of {"method": "custom_class", "model": "vllm_echo...."}: defaults,
        # with K taken from vLLM's own config.
        k = vllm_config.speculative_config.num_speculative_tokens
        return EchoSettings(method=method, num_speculative_tokens=k)
    return EchoSettings.from_dict(extra)
