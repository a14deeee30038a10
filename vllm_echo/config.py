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

ECHO_KEYS = frozenset({"k_max", "delta", "max_sweet_spots", "calibration_steps", "gating",
                       "fixed_tau", "shared_budget"})
GATING_MODES = ("sparse", "dense")
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

    ECHO only (``method="echo"``):
        k_max: verification budget per step for the whole batch, in draft tokens
            (Σ K_i <= k_max). None: chosen every step from the measured cost of a
            forward pass versus tokens verified (fitted during warm-up).
        delta: AUC a depth needs to become a gating "sweet spot", in (0.5, 1).
        max_sweet_spots: at most this many gated depths.
        calibration_steps: verify steps of warm-up before sweet spots and
            thresholds are calibrated and frozen (documented defaults before).
        gating: "sparse" (gate only at sweet spots) or "dense" (ablation: every depth).
        fixed_tau: ablation: one threshold for all sweet spots (true = 0.2, or a
            probability); false = per-depth calibrated thresholds.
        shared_budget: ablation switch: false gives every request a fixed K (its
            cap, num_speculative_tokens, or k_max // B when k_max is set) instead of
            one batch budget; every request with candidates then drafts.
    """

    method: str = "logitspec"
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    max_ngram: int | None = None
    span: int = 20
    topk: int = 64
    capacity: int = 64
    tree: bool = True
    tree_attention: str | None = None
    k_max: int | None = None
    delta: float = 0.75
    max_sweet_spots: int = 3
    calibration_steps: int = 256
    gating: str = "sparse"
    fixed_tau: bool | float = False
    shared_budget: bool = True

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
                                ("capacity", 2, 129)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpeculativeConfigError(
                    f"speculative_config: {name}={value!r} has type {type(value).__name__}; "
                    f"expected an integer")
            if value < low or (high is not None and value > high):
                allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
                raise SpeculativeConfigError(
                    f"speculative_config: {name}={value!r} is out of range; allowed: {allowed}")

        for name in ("tree", "shared_budget"):
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
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) \
                or not 0.5 < self.delta < 1:
            bad("delta", "a number in (0.5, 1)")
        for name, low, high in (("max_sweet_spots", 1, 16), ("calibration_steps", 1, 10**7)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                bad(name, f"an integer in [{low}, {high}]")
        if self.gating not in GATING_MODES:
            bad("gating", " or ".join(map(repr, GATING_MODES)))
        tau = self.fixed_tau
        if not isinstance(tau, bool) and (not isinstance(tau, (int, float)) or not 0 < tau < 1):
            bad("fixed_tau", "true, false or a probability in (0, 1)")

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
    def fixed_tau_value(self) -> float | None:
        if self.fixed_tau is False:
            return None
        return 0.2 if self.fixed_tau is True else float(self.fixed_tau)

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
