# SPDX-License-Identifier: Apache-2.0
"""The usage counts OpenAI returns for a predicted output.

Apart from algos/prediction.py on purpose: the API server imports this, and must not
load numba there (vLLM's CPU worker start scans every loaded module's objects, and
llvmlite's trip that scan when the worker runs in the same process).
"""

from __future__ import annotations

from difflib import SequenceMatcher

import numpy as np


def usage_counts(prediction: list[int] | np.ndarray, output: list[int] | np.ndarray
                 ) -> tuple[int, int]:
    """(accepted, rejected) prediction tokens for one completion, OpenAI's usage fields.

    accepted: the prediction's tokens that the completion contains in the same order
    (the matching blocks of a longest-matching-block alignment, difflib's, without its
    junk heuristic); rejected: the prediction's other tokens. Deterministic, needs
    only the two token lists: O(n x m) in the worst case, milliseconds at a few
    thousand tokens.
    """
    pred = [int(t) for t in prediction]
    out = [int(t) for t in output]
    if not pred:
        return 0, 0
    matcher = SequenceMatcher(None, pred, out, autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(pred) - accepted
