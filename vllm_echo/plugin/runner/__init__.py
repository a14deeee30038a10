# SPDX-License-Identifier: Apache-2.0
"""The model runner side of a step: hooks on the runner instance that owns our
proposer, the step's tree state, verdicts and timing. Imports nothing from
``attention`` or ``proposers``."""
