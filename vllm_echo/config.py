# SPDX-License-Identifier: Apache-2.0
"""The plugin's settings: one frozen dataclass, validated before any engine starts.

Users write them inside vLLM's speculative config, e.g.
``{"method": "logitspec", "num_speculative_tokens": 8, "max_ngram": 3}``. The glue
(vllm_echo/plugin/config_shim.py) pops them out, validates them here and carries
them to every process in ``VllmConfig.additional_config[ADDITIONAL_CONFIG_KEY]``.
No vLLM import: this module is unit-tested on its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

ADDITIONAL_CONFIG_KEY = "vllm_echo"

METHODS = ("logitspec", "echo")

# Keys of vLLM's own SpeculativeConfig that make sense next to our methods; they are
# passed through to vLLM untouched (vLLM validates them).
VLLM_PASSTHROUGH_KEYS = frozenset({
    "num_speculative_tokens",
    "max_model_len",
    "disable_by_batch_size",
    "disable_log_stats",
})

# Chain-mode draft length when the user gives none. On the 2-core CPU a verified
# token costs real compute (see docs and benchmarks), so the default is short.
DEFAULT_NUM_SPECULATIVE_TOKENS = 4


@dataclass(frozen=True)
class EchoSettings:
    """Settings of the ``logitspec`` and ``echo`` methods.

    Defaults follow the LogitSpec reference (m = 3, span 20, top-k 64, capacity 64).

    Attributes:
        method: "logitspec" or "echo".
        num_speculative_tokens: most draft tokens sent to vLLM per request and step
            (vLLM's K; drafts are clipped to it).
        max_ngram: longest m-gram indexed and matched (m = max_ngram..1).
        span: continuation length stored and retrieved per match.
        topk: next-next candidates taken from the target's last logits.
        capacity: most verified tokens per request and step in the draft forest,
            counting the root (drafts <= capacity - 1).
        tree: verify the whole forest as a token tree (default); False sends one
            chain per request (chain mode).
    """

    method: str = "logitspec"
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    max_ngram: int = 3
    span: int = 20
    topk: int = 64
    capacity: int = 64
    tree: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"speculative_config: method={self.method!r} is not a vllm-echo method; "
                f"allowed: {', '.join(METHODS)}")
        for name, low, high in (("num_speculative_tokens", 1, 128), ("max_ngram", 1, 8),
                                ("span", 1, 1024), ("topk", 1, None),
                                # vLLM's rejection sampler caps drafts at 128 per request
                                ("capacity", 2, 129)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"speculative_config: {name}={value!r} has type {type(value).__name__}; "
                    f"expected an integer")
            if value < low or (high is not None and value > high):
                allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
                raise ValueError(
                    f"speculative_config: {name}={value!r} is out of range; allowed: {allowed}")

        if not isinstance(self.tree, bool):
            raise ValueError(f"speculative_config: tree={self.tree!r} has type "
                             f"{type(self.tree).__name__}; expected true or false")

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "EchoSettings":
        """Build from the user's dict; unknown keys are errors that list the allowed ones."""
        if not isinstance(raw, Mapping):
            raise ValueError(
                f"speculative_config must be a JSON object, got {type(raw).__name__}")
        known = cls.field_names()
        unknown = sorted(k for k in raw if k not in known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))} for "
                f"method {raw.get('method')!r}; allowed: {', '.join(sorted(known))}")
        return cls(**dict(raw))

    @property
    def max_drafts(self) -> int:
        """Most draft tokens per request and step that vLLM must accept (its K)."""
        if self.tree:
            return min(self.num_speculative_tokens, self.capacity - 1)
        return self.num_speculative_tokens

    def check_vocab(self, vocab_size: int) -> None:
        """Checks that need the target model (run when vLLM builds its config)."""
        if self.topk > vocab_size:
            raise ValueError(
                f"speculative_config: topk={self.topk} is larger than the model's "
                f"vocabulary ({vocab_size}); allowed: 1..{vocab_size}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
