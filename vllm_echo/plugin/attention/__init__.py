# SPDX-License-Identifier: Apache-2.0
"""Tree attention: where it is available, the CPU native and FLEX backends, the
FLEX tree mask and KV compaction. Imports from ``runner``, never from ``proposers``."""
