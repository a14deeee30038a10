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


@pytest.fixture(scope="session")
def greedy_reference(model_path, spec_bench_16) -> list[list[int]]:
    """No-speculation greedy outputs of the 16 chats (fp32, REFERENCE_MAX_TOKENS),
    shared by the greedy engine tests: a shorter greedy run of the same prompts is a
    prefix of it, whatever the batch."""
    from engine_helpers import REFERENCE_MAX_TOKENS, engine
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=REFERENCE_MAX_TOKENS)
    with engine(model_path) as llm:
        outs = llm.chat([p.as_chat() for p in spec_bench_16], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for one test module, shut down at its end (its replicas and
    daemons would otherwise compete for the cores with every later test); yields the
    folder of its worker logs. 6 logical CPUs on any host: Ray Serve LLM
    books 2 per replica (replica and engine) and 1 for the OpenAI ingress, and the Serve
    test runs two replicas; the Ray Data tests run three 1-CPU replicas at once."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    ray = pytest.importorskip("ray")
    temp_dir = tempfile.mkdtemp(prefix="ray-")  # short: Ray puts its sockets under it
    # Serve's proxy answers its health check within 10 s by default; while two replicas
    # start their engines on 2 cores it once did not, and Serve failed the app. The
    # cluster's processes inherit this from the driver.
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        yield Path(temp_dir) / "session_latest" / "logs"
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
