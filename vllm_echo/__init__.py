# SPDX-License-Identifier: Apache-2.0
"""vllm-echo: LogitSpec and ECHO speculative decoding for stock vLLM.

Importing this package is cheap on purpose: vLLM loads the plugin in every
process, so nothing here imports torch, numba kernels or vLLM.
"""

__version__ = "0.1.0"
