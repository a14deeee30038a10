# SPDX-License-Identifier: Apache-2.0
"""The patches ``register()`` installs in every process where vLLM loads the plugin:
``EngineArgs.create_speculative_config`` (patches.py entry 1),
``EngineArgs.create_engine_config`` (entry 5, which also installs Predicted Outputs,
entries 12-14) and ``NewRequestData.from_request`` (entry 11). Why each exists, what it
stands in for and when it can go: patches.py.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_echo.plugin.tenancy import CACHE_SALT_KEY, mark_request

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_MARK = "_vllm_echo_patched"


def patch_create_speculative_config() -> None:
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_speculative_config
    if getattr(original, _MARK, False):
        return  # idempotent: vLLM loads plugins in several places per process

    from vllm_echo.plugin import config_shim

    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        _fold_spec_flags(self)
        spec = self.speculative_config
        if config_shim.is_our_method(spec):
            self.speculative_config, self.additional_config = config_shim.rewrite(
                spec, self.additional_config, target_model_config, target_parallel_config)
        return original(self, target_model_config, target_parallel_config)

    setattr(create_speculative_config, _MARK, True)
    EngineArgs.create_speculative_config = create_speculative_config


def patch_create_engine_config() -> None:
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def create_engine_config(self, *args, **kwargs):
        vllm_config = original(self, *args, **kwargs)
        from vllm_echo.plugin import config_shim, metrics, predicted_outputs_patches

        if metrics.uses_plugin(vllm_config):
            config_shim.refuse_unsupported_engine(vllm_config)
            metrics.install_collector(vllm_config)
            predicted_outputs_patches.install()
        return vllm_config

    setattr(create_engine_config, _MARK, True)
    EngineArgs.create_engine_config = create_engine_config


def patch_new_request_salt() -> None:
    """Entry 11: mark every request with its cache_salt's pool for the workers."""
    try:
        from vllm.v1.core.sched.output import NewRequestData

        func = NewRequestData.__dict__["from_request"].__func__
    except (ImportError, KeyError, AttributeError) as exc:
        logger.warning(
            "vllm-echo: cannot mark requests with their cache_salt's pool (%s); shared "
            "draft sources are OFF: workers find no mark, so no request drafts from a "
            "shared pool.", exc)
        return
    if getattr(func, _MARK, False):
        return
    client_key_seen = False

    @functools.wraps(func)
    def from_request(cls, request, *args, **kwargs):
        nonlocal client_key_seen
        data = func(cls, request, *args, **kwargs)
        params = getattr(data, "sampling_params", None)
        if params is not None and mark_request(params, getattr(request, "cache_salt", None)):
            if not client_key_seen:
                client_key_seen = True
                logger.warning(
                    "vllm-echo: the plugin's reserved extra_args key %r was sent by a client "
                    "and is ignored; salts are server-owned (cache_salt). Logged once.",
                    CACHE_SALT_KEY)
        return data

    setattr(from_request, _MARK, True)
    NewRequestData.from_request = classmethod(from_request)


def _fold_spec_flags(engine_args: Any) -> None:
    """``--spec-method echo [--spec-tokens N]`` means the same as the JSON config.

    vLLM merges these flags into the dict inside the original (arg_utils.py:2068-2081),
    after our rewrite would have run, so ours are merged here the same way.
    """
    from vllm_echo.config import METHODS, SpeculativeConfigError

    if getattr(engine_args, "spec_method", None) not in METHODS:
        return
    spec = dict(engine_args.speculative_config or {})
    for flag, key, attr in (("--spec-method", "method", "spec_method"),
                            ("--spec-model", "model", "spec_model"),
                            ("--spec-tokens", "num_speculative_tokens", "spec_tokens")):
        value = getattr(engine_args, attr, None)
        if value is None:
            continue
        if key in spec:
            raise SpeculativeConfigError(
                f"{flag} and --speculative-config['{key}'] are mutually exclusive; "
                "allowed: one of them")
        spec[key] = value
        setattr(engine_args, attr, None)
    engine_args.speculative_config = spec
