# SPDX-License-Identifier: Apache-2.0
"""The plugin entry point and the config shim, without starting an engine."""

import json
from importlib.metadata import entry_points

import pytest

from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.config_shim import CPU_ECHO_CAPACITY, CPU_LOGITSPEC_CAPACITY


def _engine_config(model_path, spec, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model_path, speculative_config=spec, dtype="float32",
                      enforce_eager=True, max_model_len=2048, **kwargs)
    return args.create_engine_config()


def test_entry_point_is_registered_for_vllm():
    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "vllm_echo"]
    assert [e.value for e in eps] == ["vllm_echo.plugin:register"]


def test_register_is_idempotent():
    from vllm.engine.arg_utils import EngineArgs

    import vllm_echo.plugin as plugin
    from vllm_echo.plugin import register_patches

    plugin.register()
    wrapped = EngineArgs.create_speculative_config, EngineArgs.create_engine_config
    plugin._registered = False  # as if a second process-level call site ran it again
    plugin.register()
    register_patches.patch_create_speculative_config()
    register_patches.patch_create_engine_config()
    assert (EngineArgs.create_speculative_config, EngineArgs.create_engine_config) == wrapped
    for fn in wrapped:
        assert not getattr(fn.__wrapped__, "_vllm_echo_patched", False)


def test_register_fixes_the_rejection_sampler_for_every_method():
    # patches.py entry 6: installed where the plugin loads, not by our proposers, so
    # vLLM's own methods (ngram, ...) verify sampled requests right on CPU too
    # (the engine test: tests/vllm/test_vllm_ngram_on_cpu.py)
    import vllm_echo.plugin as plugin

    plugin.register()
    from vllm.v1.sample import rejection_sampler

    from vllm_echo.plugin.runner import sampler_fixes

    assert rejection_sampler.expand_batch_to_tokens is sampler_fixes.expand_batch_to_tokens
    assert getattr(rejection_sampler.apply_top_k_top_p, "_vllm_echo_sampler_fix", False)


@pytest.mark.parametrize("method", ["logitspec", "echo"])
def test_method_becomes_custom_class_with_settings_in_additional_config(model_path, method):
    cfg = _engine_config(model_path, {"method": method, "num_speculative_tokens": 6,
                                      "max_ngram": 2, "span": 10})
    spec = cfg.speculative_config
    assert spec.method == "custom_class"
    assert spec.model == {"logitspec": "vllm_echo.plugin.proposers.logitspec.LogitSpecProposer",
                          "echo": "vllm_echo.plugin.proposers.echo.EchoProposer"}[method]
    assert spec.num_speculative_tokens == 6
    ours = cfg.additional_config[ADDITIONAL_CONFIG_KEY]
    assert (ours["method"], ours["max_ngram"], ours["span"], ours["topk"]) == (method, 2, 10, 64)
    # the CPU default tree sizes come from the measured cost curve
    assert ours["capacity"] == (CPU_LOGITSPEC_CAPACITY if method == "logitspec" else CPU_ECHO_CAPACITY)
    # on CPU both methods verify chains unless trees are asked for
    assert ours["tree"] is False


@pytest.mark.parametrize("method", ["logitspec", "echo"])
def test_trees_on_cpu_when_asked_for(model_path, method):
    for spec in ({"method": method, "tree": True}, {"method": method, "capacity": 16}):
        ours = _engine_config(model_path, spec).additional_config[ADDITIONAL_CONFIG_KEY]
        assert ours["tree"] is True, spec


def test_echo_chains_on_cpu_are_sized_by_echo_up_to_its_forest(model_path):
    """LogitSpec's CPU chains are short (K = 4); ECHO's K is only a cap on the root path
    it picks from its forest."""
    cfg = _engine_config(model_path, {"method": "echo"})
    assert cfg.speculative_config.num_speculative_tokens == CPU_ECHO_CAPACITY - 1
    cfg = _engine_config(model_path, {"method": "logitspec"})
    assert cfg.speculative_config.num_speculative_tokens == 4


def test_tree_attention_defaults_to_the_platform_and_is_checked_against_it(monkeypatch):
    from vllm_echo.plugin import config_shim

    def tree_attention(spec):
        return config_shim.rewrite(spec, None)[1][ADDITIONAL_CONFIG_KEY]["tree_attention"]

    assert tree_attention({"method": "echo"}) == config_shim.CPU_TREE_ATTENTION
    assert tree_attention({"method": "echo", "tree_attention": "flex"}) == "flex"
    monkeypatch.setattr(config_shim, "_on_cpu", lambda: False)
    assert tree_attention({"method": "logitspec"}) == "flex"
    with pytest.raises(ValueError, match="tree_attention='native' is the CPU backend's"):
        tree_attention({"method": "logitspec", "tree_attention": "native"})


def test_kv_connectors_and_async_scheduling_are_refused_by_name(model_path):
    from vllm.config import KVTransferConfig

    from vllm_echo.plugin.config_shim import refuse_unsupported_engine

    connector = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both")
    with pytest.raises(ValueError) as err:
        _engine_config(model_path, {"method": "echo"}, kv_transfer_config=connector)
    assert "KV connectors" in str(err.value) and "'echo'" in str(err.value)
    # vLLM turns async scheduling off for custom_class proposers; were that to change,
    # the final config is refused rather than run with compaction racing the schedule.
    cfg = _engine_config(model_path, {"method": "logitspec"})
    assert cfg.scheduler_config.async_scheduling is False
    refuse_unsupported_engine(cfg)
    cfg.scheduler_config.async_scheduling = True
    with pytest.raises(ValueError, match="does not support async scheduling"):
        refuse_unsupported_engine(cfg)


def test_user_additional_config_is_kept(model_path):
    cfg = _engine_config(model_path, {"method": "logitspec"}, additional_config={"other": 1})
    assert cfg.additional_config["other"] == 1
    assert ADDITIONAL_CONFIG_KEY in cfg.additional_config


def test_other_methods_are_untouched(model_path):
    cfg = _engine_config(model_path, {"method": "ngram", "num_speculative_tokens": 4,
                                      "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    assert cfg.speculative_config.method == "ngram"
    assert ADDITIONAL_CONFIG_KEY not in (cfg.additional_config or {})
    assert _engine_config(model_path, None).speculative_config is None


@pytest.mark.parametrize("spec,words", [
    ({"method": "logitspec", "budget": 3}, ["unknown key", "'budget'", "allowed"]),
    ({"method": "logitspec", "max_ngram": 0}, ["max_ngram=0", "allowed"]),
    ({"method": "logitspec", "span": "long"}, ["span='long'", "integer"]),
    ({"method": "echo", "topk": 100000}, ["topk=100000", "vocabulary (49152)"]),
    ({"method": "logitspec", "model": "x/y"}, ["'model'", "logitspec"]),
    # what a server refuses at start-up (test_serve_bad_input starts one for the line)
    ({"method": "echo", "delta": 2}, ["unknown key", "'delta'", "allowed"]),
    ({"method": "logitspec", "capacity": "big"}, ["capacity='big'", "integer"]),
    ({"method": "echo", "k_max": 0}, ["k_max=0", "integer >= 1"]),
    ({"method": "echo", "disable_by_batch_size": "many"},
     ["disable_by_batch_size='many'", "integer >= 2"]),
    ({"method": "echo", "model": "some/drafter"}, ["'model'", "remove it"]),
])
def test_bad_settings_fail_before_the_engine_starts(model_path, spec, words):
    with pytest.raises(ValueError) as err:
        _engine_config(model_path, spec)
    for word in words:
        assert word in str(err.value)


def test_cli_speculative_config_reaches_the_shim(model_path):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", model_path, "--dtype", "float32", "--max-model-len",
                            "2048", "--speculative-config",
                            json.dumps({"method": "logitspec", "topk": 8})])
    cfg = AsyncEngineArgs.from_cli_args(ns).create_engine_config()
    assert cfg.speculative_config.method == "custom_class"
    assert cfg.additional_config[ADDITIONAL_CONFIG_KEY]["topk"] == 8


def test_spec_method_argument_means_the_same_as_the_json_config(model_path):
    cfg = _engine_config(model_path, {"max_ngram": 2}, spec_method="echo", spec_tokens=5)
    assert cfg.speculative_config.method == "custom_class"
    ours = cfg.additional_config[ADDITIONAL_CONFIG_KEY]
    assert (ours["method"], ours["max_ngram"], ours["num_speculative_tokens"]) == ("echo", 2, 5)
    with pytest.raises(ValueError, match="mutually exclusive"):
        _engine_config(model_path, {"method": "echo"}, spec_method="echo")


def test_engine_config_registers_the_metrics_collector_only_for_our_methods(model_path):
    from vllm_echo.plugin import metrics

    cfg = _engine_config(model_path, {"method": "ngram", "num_speculative_tokens": 4,
                                      "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    assert metrics._COLLECTOR is None or cfg.instance_id not in metrics._COLLECTOR.instances
    cfg = _engine_config(model_path, {"method": "echo"})
    assert metrics._COLLECTOR.instances[cfg.instance_id] == model_path


def _model(**flags):
    from types import SimpleNamespace

    base = dict(runner_type="generate", is_encoder_decoder=False, is_attention_free=False,
                is_hybrid=False, architectures=["X"], get_vocab_size=lambda: 1000)
    return SimpleNamespace(**{**base, **flags})


@pytest.mark.parametrize("flags,words", [
    ({"runner_type": "pooling"}, ["generative model", "'pooling'", "allowed: 'generate'"]),
    ({"is_encoder_decoder": True}, ["encoder-decoder", "allowed"]),
    ({"is_attention_free": True}, ["attention-free", "allowed"]),
])
def test_unsupported_models_are_refused_by_name(flags, words):
    from vllm_echo.plugin.config_shim import rewrite

    with pytest.raises(ValueError) as err:
        rewrite({"method": "echo"}, None, _model(**flags))
    for word in words:
        assert word in str(err.value)


def test_hybrid_models_switch_to_chain_unless_trees_were_asked_for():
    from vllm_echo.plugin.config_shim import rewrite

    spec, extra = rewrite({"method": "logitspec", "capacity": 32}, None,
                          _model(is_hybrid=True))
    assert extra[ADDITIONAL_CONFIG_KEY]["tree"] is False
    assert spec["num_speculative_tokens"] == 4  # the chain default, not a forest's room
    # ECHO's rule chooses each chain's length: K leaves it the forest's room
    spec, extra = rewrite({"method": "echo", "capacity": 32}, None, _model(is_hybrid=True))
    assert extra[ADDITIONAL_CONFIG_KEY]["tree"] is False
    assert spec["num_speculative_tokens"] == 31
    with pytest.raises(ValueError, match="tree=true is not supported with"):
        rewrite({"method": "echo", "tree": True}, None, _model(is_hybrid=True))


@pytest.mark.parametrize("method", ["logitspec", "echo"])
def test_pipeline_parallelism_is_refused_before_the_workers_start(model_path, method):
    # vLLM 0.32's workers die at KV-cache setup with any speculative method under
    # pipeline parallelism (its own ngram included): one line at config time instead
    with pytest.raises(ValueError) as err:
        _engine_config(model_path, {"method": method}, pipeline_parallel_size=2)
    for word in ("pipeline parallelism", "pipeline_parallel_size=2", f"{method!r}",
                 "allowed: pipeline_parallel_size=1"):
        assert word in str(err.value)
