# SPDX-License-Identifier: Apache-2.0
import pytest

from vllm_echo import prompts
from vllm_echo.models import default_model_path


@pytest.fixture(scope="session")
def model_path() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def spec_bench_16():
    return prompts.load(prompts.SPEC_BENCH, n=16)
