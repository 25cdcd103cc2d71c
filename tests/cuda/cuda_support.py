"""Markers of the CUDA suites: each test runs only where torch sees the GPUs it needs.

On a machine without CUDA (CI) the suites are still collected (imports and fixtures checked)
and every test skips. ``bash run.sh gpu-check`` runs them on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (distributed / replica paths)"
)
