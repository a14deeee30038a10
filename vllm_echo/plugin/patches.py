# SPDX-License-Identifier: Apache-2.0
"""Every change vllm-echo makes to vLLM, in one place.

Each entry says what is patched, why, and which upstream code it stands in for
(vLLM 0.32.0 line numbers). Nothing else in the package modifies vLLM.

1. ``EngineArgs.create_speculative_config`` (class attribute, wrapped)
   What: if ``speculative_config`` is ``{"method": "logitspec" | "echo", ...}``,
      rewrite it to ``method="custom_class"`` + our proposer class and move our keys
      into ``additional_config["vllm_echo"]``; otherwise call the original unchanged.
   Why: ``SpeculativeConfig.method`` is a closed pydantic Literal and the config
      forbids extra keys (vllm/config/speculative.py:73-83, config/utils.py:71).
   Upstream: vllm/engine/arg_utils.py:2060-2099, the only place the user's dict
      becomes a SpeculativeConfig (used by LLM, EngineArgs, AsyncEngineArgs, serve).

2. ``runner._sample`` (instance attribute of the runner that owns our proposer)
   What: after the original sampling, record the top-k token ids of the raw logits
      row that produced each request's last token.
   Why: LogitSpec's next-next candidates come from those logits, and the
      custom_class contract passes no logits to ``propose()``.
   Upstream: vllm/v1/worker/gpu_model_runner.py:3437-3466 (_sample); installed
      from our proposer's ``load_model`` (gpu_model_runner.py:5070, cpu_model_runner.py:74).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger("vllm_echo")

_MARK = "_vllm_echo_patched"


def patch_create_speculative_config() -> None:
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_speculative_config
    if getattr(original, _MARK, False):
        return  # idempotent: vLLM loads plugins in several places per process

    from vllm_echo.plugin import config_shim

    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        spec = self.speculative_config
        if config_shim.is_our_method(spec):
            vocab = _vocab_size(target_model_config)
            self.speculative_config, self.additional_config = config_shim.rewrite(
                spec, self.additional_config, vocab)
        return original(self, target_model_config, target_parallel_config)

    setattr(create_speculative_config, _MARK, True)
    EngineArgs.create_speculative_config = create_speculative_config


def _vocab_size(model_config: Any) -> int | None:
    try:
        return int(model_config.get_vocab_size())
    except Exception:  # the vocabulary check is a convenience; vLLM validates the rest
        return None
