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

ECHO_KEYS = frozenset({"k_max"})
# How tree rows get their mask: "native" is the CPU backend's own kernel plus torch
# for the tree rows (CPU only); "flex" is vLLM's FLEX_ATTENTION with the tree mask
# (CUDA, and CPU through vllm_echo/plugin/cpu_flex_attention.py).
TREE_ATTENTION_MODES = ("native", "flex")

class SpeculativeConfigError(ValueError):
    """A speculative config vllm-echo cannot run; the message is one line naming
    the key, the value and what is allowed (printed without a traceback when it
    stops the server: vllm_echo.plugin.errors)."""


# Longest m-gram when the user gives none. LogitSpec keeps its reference's 3. ECHO
# scores a retrieved token by the length of the match that found it, so a long match
# (a copied line) earns its own, higher acceptance rate; and where a short m-gram's
# latest occurrence can be the reply itself, a long one is more often unique.
LOGITSPEC_MAX_NGRAM = 3
ECHO_MAX_NGRAM = 8

# Chain-mode draft length when the user gives none. On the 2-core CPU a verified
# token costs real compute (see docs and benchmarks), so the default is short.
DEFAULT_NUM_SPECULATIVE_TOKENS = 4


@dataclass(frozen=True)
class EchoSettings:
    """Settings of the ``logitspec`` and ``echo`` methods.

    Defaults follow the LogitSpec reference (m = 3, span 20, top-k 64, capacity 64),
    except ECHO's m (ECHO_MAX_NGRAM).

    Attributes:
        method: "logitspec" or "echo".
        num_speculative_tokens: most draft tokens sent to vLLM per request and step
            (vLLM's K; drafts are clipped to it).
        max_ngram: longest m-gram indexed and matched (m = max_ngram..1); None:
            LOGITSPEC_MAX_NGRAM or ECHO_MAX_NGRAM, by method.
        span: continuation length stored and retrieved per match.
        topk: next-next candidates taken from the target's last logits.
        capacity: most verified tokens per request and step in the draft forest,
            counting the root (drafts <= capacity - 1).
        tree: verify the whole forest as a token tree (default); False sends one
            chain per request (chain mode).
        tree_attention: "native" or "flex" (TREE_ATTENTION_MODES); None: the
            platform's default, filled in by the glue before the engine starts.
        shared_outputs: also draft from other requests' outputs (same ``cache_salt``
            only; requests without one share a pool), vllm_echo.algos.shared_outputs.
            Off by default: it pays only where outputs repeat across requests (tool
            calls), and a shared pool is the operator's privacy choice (README).
        shared_outputs_mib: memory for those outputs, per engine (oldest and rarest
            continuations are evicted first).
        recycled: also draft from the recycled-candidates table (the target's earlier
            top-k after the same token; token ids only; one table per ``cache_salt``),
            vllm_echo.algos.recycled.
            Off by default: it needs the top-k of every request's logits every step,
            which ECHO otherwise skips when no next-next head can pay, and it added
            little where measured (journal 2026-12-06).

    ECHO only (``method="echo"``):
        k_max: a fixed verification budget per step for the whole batch, in draft
            tokens: the k_max most likely nodes. None: chosen every step by expected
            tokens per second under the step-cost curve (vllm_echo.algos.echo).
    """

    method: str = "logitspec"
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    max_ngram: int | None = None
    span: int = 20
    topk: int = 64
    capacity: int = 64
    tree: bool = True
    tree_attention: str | None = None
    shared_outputs: bool = False
    shared_outputs_mib: int = 32
    recycled: bool = False
    k_max: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative_config: method={self.method!r} is not a vllm-echo method; "
                f"allowed: {', '.join(METHODS)}")
        if self.max_ngram is None:
            object.__setattr__(self, "max_ngram", ECHO_MAX_NGRAM if self.method == "echo"
                               else LOGITSPEC_MAX_NGRAM)
        for name, low, high in (("num_speculative_tokens", 1, 128), ("max_ngram", 1, 8),
                                ("span", 1, 1024), ("topk", 1, None),
                                # vLLM's rejection sampler caps drafts at 128 per request
                                ("capacity", 2, 129), ("shared_outputs_mib", 1, 65536)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpeculativeConfigError(
                    f"speculative_config: {name}={value!r} has type {type(value).__name__}; "
                    f"expected an integer")
            if value < low or (high is not None and value > high):
                allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
                raise SpeculativeConfigError(
                    f"speculative_config: {name}={value!r} is out of range; allowed: {allowed}")

        for name in ("tree", "shared_outputs", "recycled"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise SpeculativeConfigError(f"speculative_config: {name}={value!r} has type "
                                             f"{type(value).__name__}; expected true or false")
        if self.tree_attention is not None and self.tree_attention not in TREE_ATTENTION_MODES:
            raise SpeculativeConfigError(
                f"speculative_config: tree_attention={self.tree_attention!r} is invalid; "
                f"allowed: {' or '.join(map(repr, TREE_ATTENTION_MODES))}")
        self._check_echo()

    def _check_echo(self) -> None:
        def bad(name, allowed):
            raise SpeculativeConfigError(f"speculative_config: {name}={getattr(self, name)!r} is invalid; "
                             f"allowed: {allowed}")

        if self.k_max is not None and (isinstance(self.k_max, bool)
                                       or not isinstance(self.k_max, int) or self.k_max < 1):
            bad("k_max", "an integer >= 1, or null for the measured default")

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "EchoSettings":
        """Build from the user's dict; unknown keys are errors that list the allowed ones."""
        if not isinstance(raw, Mapping):
            raise SpeculativeConfigError(
                f"speculative_config must be a JSON object, got {type(raw).__name__}")
        method = raw.get("method", "logitspec")
        known = cls.field_names() if method == "echo" else cls.field_names() - ECHO_KEYS
        unknown = sorted(k for k in raw if k not in known)
        if unknown:
            hint = ""
            if set(unknown) & ECHO_KEYS:
                hint = " (ECHO keys apply to method 'echo' only)"
            raise SpeculativeConfigError(
                f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))} for "
                f"method {method!r}{hint}; allowed: {', '.join(sorted(known))}")
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
            raise SpeculativeConfigError(
                f"speculative_config: topk={self.topk} is larger than the model's "
                f"vocabulary ({vocab_size}); allowed: 1..{vocab_size}")

    def to_dict(self) -> dict[str, Any]:
        """The settings of this method (``from_dict`` round-trips it)."""
        out = dataclasses.asdict(self)
        if self.method != "echo":
            for key in ECHO_KEYS:
                del out[key]
        return out
