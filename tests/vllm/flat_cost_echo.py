# SPDX-License-Identifier: Apache-2.0
"""ECHO with a GPU-like step-cost curve instead of the one it measures (tests only),
loaded by vLLM's worker process through ``{"method": "custom_class", "model":
"flat_cost_echo.FlatCostEchoProposer"}`` with ECHO's settings in additional_config
(:func:`speculative_config` builds both; tests/vllm is on sys.path, which spawned vLLM
processes inherit).

On a GPU below its knee a verified token costs next to nothing; on this CPU every one
costs compute, and the curve ECHO measures rightly makes it verify chains (or little).
The injected curve is flat up to KNEE verified tokens per step and then doubles: the
decision rule fills each step up to the knee, and in tree mode a request keeps every
node that adds expected tokens, so default ECHO (no ``k_max``) verifies trees here by
construction. Timed steps do not correct the injected curve.
"""

from __future__ import annotations

from typing import Any

from vllm_echo.plugin.proposers.echo import EchoProposer

FLAT_STEP_S = 0.05  # a step's time up to the knee (only ratios decide)
KNEE = 24  # verified tokens per step (one per request included) that cost nothing extra


class FlatCostEchoProposer(EchoProposer):
    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self._inject_curve()

    def observe_step_cost(self, num_tokens, seconds, drafted) -> None:
        pass  # timed steps do not correct the injected curve

    def _set_cost_curve(self, sizes, seconds, took) -> None:
        self._inject_curve()  # the start-up probe's curve is not used either

    def _inject_curve(self) -> None:
        self.planner.cost.set_curve([1, KNEE, KNEE + 1, 4 * KNEE],
                                    [FLAT_STEP_S, FLAT_STEP_S, 2 * FLAT_STEP_S,
                                     8 * FLAT_STEP_S])


def speculative_config(spec: dict) -> tuple[dict, dict]:
    """``(speculative_config, additional_config)`` for an engine that runs ``spec`` (one
    of our ``{"method": "echo", ...}`` configs, defaults resolved as for the plain
    method) with FlatCostEchoProposer as its proposer."""
    from vllm_echo.plugin.config_shim import rewrite

    vllm_spec, additional = rewrite(spec, None)
    assert additional and spec["method"] == "echo"
    return {**vllm_spec, "model": f"{__name__}.FlatCostEchoProposer"}, additional
