# SPDX-License-Identifier: Apache-2.0
"""Tensor operators (compiled CUDA kernels with pure-torch fallbacks)."""
