# SPDX-License-Identifier: Apache-2.0
"""The ``custom_class`` proposers vLLM loads for ``"method": "logitspec"`` and
``"echo"``, and the sharing of drafts between tensor-parallel ranks. The top layer
of the plugin: imports ``attention`` and ``runner``."""
