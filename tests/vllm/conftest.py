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
def no_spec_llm(model_path):
    """The session's one no-speculation engine: every test that compares with no
    speculation asks it, instead of starting a reference engine of its own (its
    logprobs are the processed ones, which only test_sampled_distribution reads; they
    change no token). It stays up until the session ends."""
    from engine_helpers import engine

    with engine(model_path, logprobs_mode="processed_logprobs") as llm:
        yield llm


@pytest.fixture(scope="session")
def greedy_reference(no_spec_llm, spec_bench_16) -> list[list[int]]:
    """No-speculation greedy outputs of the 16 chats (fp32, REFERENCE_MAX_TOKENS),
    shared by the greedy engine tests: a shorter greedy run of the same prompts is a
    prefix of it, whatever the batch."""
    from engine_helpers import REFERENCE_MAX_TOKENS
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=REFERENCE_MAX_TOKENS)
    outs = no_spec_llm.chat([p.as_chat() for p in spec_bench_16], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


# Speculative engines that tests in several modules share (default engine arguments),
# by name. Each test reads the counters it checks as differences
# (engine_helpers.since) and uses its own requests, so none depends on another's.
SHARED_SPECS = {
    "echo": {"method": "echo"},
    # LogitSpec's CPU default written out: chains of K = 4 (test_plugin checks the default)
    "logitspec-chain": {"method": "logitspec", "tree": False, "num_speculative_tokens": 4},
}


@pytest.fixture(scope="session")
def shared_engine(model_path):
    """``shared_engine(name)``: the session's engine for SHARED_SPECS[name], started on
    first use and shut down when the session ends."""
    import contextlib

    from engine_helpers import engine

    started = {}
    with contextlib.ExitStack() as stack:
        def get(name: str):
            if name not in started:
                started[name] = stack.enter_context(engine(model_path, SHARED_SPECS[name]))
            return started[name]
        yield get


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
