# SPDX-License-Identifier: Apache-2.0
"""ECHO core (numpy/numba): scores, gate calibration, gate, batch budget, cost, stats.

Per step, for a batch of retrieval forests:

1. node log-probs (target logits for next-next candidates,
   :class:`AcceptancePrior` for retrieved tokens) -> path scores S, and the gate's
   truncation depth with the current :class:`GateConfig` (:data:`DEFAULT_GATE` until a
   :class:`Calibrator` has finalized), in one compiled pass
   (:mod:`vllm_echo.algos.echo.forest_scoring`; numpy references in tests/unit);
2. :func:`schedule_budget` over :class:`CandidateTree` objects under K_max (chosen
   by the planner from its :class:`~vllm_echo.algos.echo.cost.CostModel`, as the
   compiled choices of :mod:`~vllm_echo.algos.echo.pricing`), then each request's
   selection re-indexed into its draft tree;
3. after verification: :meth:`AcceptancePrior.observe_tree` (both priors at once:
   :func:`~vllm_echo.algos.echo.scores.observe_retrieved_and_heads`),
   :meth:`Calibrator.observe` (warm-up), :meth:`EchoStepStats.record_step`.
"""

from vllm_echo.algos.echo import cost, pricing
from vllm_echo.algos.echo.budget import (BudgetResult, CandidateTree, schedule_budget,
                                         subtree)
from vllm_echo.algos.echo.calibration import (DEFAULT_GATE, Calibrator, GateConfig,
                                              auc_mann_whitney, youden_threshold)
from vllm_echo.algos.echo.scores import AcceptancePrior
from vllm_echo.algos.echo.stats import EchoStepStats

__all__ = [
    "AcceptancePrior",
    "BudgetResult",
    "Calibrator",
    "CandidateTree",
    "DEFAULT_GATE",
    "EchoStepStats",
    "GateConfig",
    "auc_mann_whitney",
    "schedule_budget",
    "subtree",
    "warm_up",
    "youden_threshold",
]


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel a planning step runs, so that
    no decode step pays for it."""
    from vllm_echo.algos.echo import planner

    # planner.warm_up plans and observes one step; cost and pricing compile what only a
    # fitted cost model reaches.
    for module in (planner, cost, pricing):
        module.warm_up()
