# SPDX-License-Identifier: Apache-2.0
"""Run by test_tenants.py in a fresh interpreter: an in-process engine with the shared
outputs on whose salt carriage is broken (patches.py entry 11 undone, as if vLLM had
changed under it), so no request reaches the worker with the plugin's pool mark. A
chat is asked unsalted, then twice by a salted tenant, then by an unsalted client that
names that tenant's salt through extra_args (what ``vllm_xargs`` becomes). Prints one JSON line: the
outputs' token ids and the drafter's counters."""

import json
import os
import sys

if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # scheduler and worker in this process
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import vllm_echo.plugin
    from engine_helpers import ENGINE_KWARGS, drafter_stats

    vllm_echo.plugin.register()  # idempotent: vLLM's own call later does nothing
    from vllm.v1.core.sched.output import NewRequestData

    NewRequestData.from_request = classmethod(NewRequestData.from_request.__func__.__wrapped__)

    from vllm import SamplingParams

    from vllm_echo.engines import build_llm
    from vllm_echo.plugin.tenancy import CACHE_SALT_KEY

    model, chat = sys.argv[1], json.loads(sys.argv[2])
    llm = build_llm({"method": "logitspec", "shared_outputs": True}, model=model,
                    **ENGINE_KWARGS)
    params = SamplingParams(temperature=0, max_tokens=int(sys.argv[3]))
    spoofed = SamplingParams(temperature=0, max_tokens=int(sys.argv[3]),
                             extra_args={CACHE_SALT_KEY: "tenant-a"})
    first = llm.chat([chat], params, use_tqdm=False)[0]  # unsalted; gives the prompt's ids
    prompt = list(first.prompt_token_ids)
    outputs = [list(first.outputs[0].token_ids)]
    for request, p in ((dict(prompt_token_ids=prompt, cache_salt="tenant-a"), params),
                       (dict(prompt_token_ids=prompt, cache_salt="tenant-a"), params),
                       (dict(prompt_token_ids=prompt), spoofed)):
        outputs.append(list(llm.generate(request, p, use_tqdm=False)[0].outputs[0].token_ids))
    print(json.dumps({"outputs": outputs, "stats": drafter_stats(llm)}))
