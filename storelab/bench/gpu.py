"""``python -m storelab.bench.gpu``: the prepared GPU check of the fla dispatch (issue 9, item 6).

One script, five sections, each step wrapped so that one failure is written into the JSON and the
rest still runs:

* ``environment``: torch and its CUDA, the device, whether fla's kernels import (and the versions
  of flash-linear-attention, fla-core, triton and transformers);
* ``correctness``: ``storelab.ops.gated_delta_rule`` and ``storelab.ops.kda`` (chunk form, our
  torch code on the device) against fla's kernels through ``storelab.ops.fla.run_fla``, B = 1,
  8 heads of width 64, T = 4,096, fp32 and bf16 inputs (q, k, v, beta; g stays fp32, as in fla's
  own tests), inputs of ``storelab.bench.kernels.delta_inputs``: max |difference| of o and of the
  final state, in one call and in three calls carrying the state (the way a store calls it, the
  last a single token, as in decoding);
* ``op_timing``: the same calls timed, median of several runs, ``torch.cuda.synchronize()`` around
  each (``time.perf_counter`` alone on a CPU), ours over fla;
* ``prefill``: the tiny zoo models with recurrent stores (kimi-k3: KDA, qwen3.8: Gated DeltaNet)
  on the device, 16,384 tokens in chunks of 1,024, tokens per second with ``STORELAB_FLA`` on
  (fla's kernels) and off (our chunked form), the last logits of the two compared, the peak of
  allocated device memory above the weights; and transformers' tiny model of the same family
  (``storelab.bench.prefill.build_peer``) with its own chunked prefill on the device;
* ``commands``: the command line with ``--device DEVICE --dtype bf16`` (``storelab.options``), each
  command its own process: ``storelab generate qwen3.8 --tiny`` (a prompt of 2,048 tokens, 8 new: the cache measured
  beside the analytic count in bf16), ``storelab probe state_swap --model tiny-qwen3.8`` and
  ``storelab probe selection --model tiny-glm-5.3 --contexts 2048`` (token ids moved to the model's
  device by ``storelab.probes.source.on_device``, the selection's masks built there): exit code, the
  device and dtype each reports, seconds, and the error's last lines when one fails.

``--quick``: T = 128, 2 heads of width 16, 256 tokens in chunks of 64; ``--device cpu --quick``
runs end to end on a CPU (fla skipped there; tests/test_fla_dispatch.py runs it), so the script
cannot rot. ``--sections`` picks sections (the environment always runs); ``--length`` overrides
the prefill length.

On the device machine (its python3 has torch 2.11 with CUDA, triton 3.6 and transformers 5.17,
but no fla): since 0.3.2 fla ships as two wheels, fla-core (fla/ops, fla/modules, fla/utils: the
kernels; pure Python, it needs torch, triton and einops) and flash-linear-attention (fla/layers,
fla/models, pinned to a range of transformers). Fetch the wheels here, without dependencies,

    pip download --no-deps -d .whl fla-core==0.6.0 einops

(fla-core 0.6.0 holds every kernel and needs only einops besides torch and triton; the ``gpu``
extra of storelab names it), carry ``.whl`` with the run, and install them there into a folder of
their own:

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:. python3 -m storelab.bench.gpu --out $OUT/gpu.json

The environment section says whether fla's kernels imported, and why not.
fla's Triton kernels compile (and autotune) on their first call, per dtype and shape: the first
correctness rows take most of the time; ``--sections`` splits a run that does not fit the device's
time. The figures go into docs/bench.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from storelab.bench.kernels import delta_inputs
from storelab.ops import fla as fla_dispatch

SECTIONS = ("correctness", "op_timing", "prefill", "commands")
PREFILL_MODELS = ("kimi-k3", "qwen3.8")  # the zoo models with recurrent stores (KDA, Gated DeltaNet)
FULL = dict(T=4096, H=8, K=64, length=16384, chunk=1024, repeats=10, prefill_repeats=2, command_length=2048)
QUICK = dict(T=128, H=2, K=16, length=256, chunk=64, repeats=3, prefill_repeats=1, command_length=64)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> tuple[list[float], Any]:
    """Wall seconds of ``repeats`` calls after ``warmup`` calls, the device synchronised around each;
    and the last call's result."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        times, out = [], None
        for _ in range(repeats):
            out = None  # the last result is not held while the next call runs (the memory peak)
            _sync(device)
            t0 = time.perf_counter()
            out = fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
    return times, out


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# -- sections ------------------------------------------------------------------------------------

def fla_for(device: torch.device) -> dict[str, Callable]:
    """fla's kernels that this device's tensors would be sent to (none on a CPU)."""
    if device.type not in fla_dispatch.FLA_DEVICES:
        return {}
    return fla_dispatch.fla_kernels(["gated_delta_rule", "kda"])


def environment(device: torch.device, kernels: dict[str, Callable]) -> dict[str, Any]:
    env: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                           "python": platform.python_version(), "STORELAB_FLA": os.environ.get("STORELAB_FLA"),
                           "fla_kernels": sorted(kernels)}
    env["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    env["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    versions = {}
    for pkg in ("flash-linear-attention", "fla-core", "triton", "transformers"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    env["versions"] = versions
    try:
        for module in ("fla.ops.gated_delta_rule", "fla.ops.kda"):
            importlib.import_module(module)
        env["fla_import"] = "ok"
    except Exception as e:
        env["fla_import"] = _error(e)
    return env


def _inputs(op: str, s: dict, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    x = delta_inputs(1, s["T"], s["H"], s["K"], per_channel=op == "kda")
    return {n: t.to(device=device, dtype=torch.float32 if n == "g" else dtype) for n, t in x.items()}


def _ours(op: str) -> Callable:
    from storelab import ops

    return ops.gated_delta_rule if op == "gated_delta_rule" else ops.kda


def _against_fla(fn: Callable, x: dict[str, torch.Tensor], o: torch.Tensor, S: torch.Tensor) -> dict[str, Any]:
    """fla's kernel on the same inputs against our (o, S): in one call, and in three calls carrying the
    state the way a store does (a first part ending off the kernels' 64-token chunks, the rest, and
    a last single token, as in decoding)."""
    run = fla_dispatch.run_fla
    o_f, S_f = run(fn, x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], output_final_state=True)
    T = x["q"].shape[1]
    parts, S_p = [], None
    for sl in (slice(0, T // 2 + 7), slice(T // 2 + 7, T - 1), slice(T - 1, T)):
        p = {n: t[:, sl] for n, t in x.items()}
        o_p, S_p = run(fn, p["q"], p["k"], p["v"], g=p["g"], beta=p["beta"], initial_state=S_p,
                       output_final_state=True)
        parts.append(o_p)
    return dict(fla="ok", o_max_abs_diff=_max_diff(o_f, o), S_max_abs_diff=_max_diff(S_f, S),
                split_o_max_abs_diff=_max_diff(torch.cat(parts, dim=1), o), split_S_max_abs_diff=_max_diff(S_p, S))


def correctness(device: torch.device, kernels: dict[str, Callable], s: dict) -> list[dict[str, Any]]:
    rows = []
    for op in ("gated_delta_rule", "kda"):
        for dname, dtype in DTYPES.items():
            row: dict[str, Any] = {"op": op, "dtype": dname, "B": 1, "T": s["T"], "H": s["H"], "K": s["K"]}
            try:
                x = _inputs(op, s, dtype, device)
                with torch.inference_mode():
                    o, S = _ours(op)(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], output_final_state=True)
                    row.update(ours_o_finite=bool(torch.isfinite(o).all()), o_abs_max=float(o.abs().max()))
                    fn = kernels.get(op)
                    row.update(_against_fla(fn, x, o, S) if fn is not None else {"fla": "unavailable"})
            except Exception as e:
                row["error"] = _error(e)
            rows.append(row)
    return rows


def op_timing(device: torch.device, kernels: dict[str, Callable], s: dict) -> list[dict[str, Any]]:
    rows = []
    for op in ("gated_delta_rule", "kda"):
        for dname, dtype in DTYPES.items():
            row: dict[str, Any] = {"op": op, "dtype": dname, "T": s["T"], "H": s["H"], "K": s["K"],
                                   "statistic": f"median of {s['repeats']}"}
            try:
                x = _inputs(op, s, dtype, device)
                ours = _ours(op)
                t, _ = _seconds(lambda: ours(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], output_final_state=True),
                                device, s["repeats"])
                row["ours_ms"] = statistics.median(t) * 1e3
                fn = kernels.get(op)
                if fn is not None:
                    t, _ = _seconds(lambda: fla_dispatch.run_fla(fn, x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                                 output_final_state=True), device, s["repeats"])
                    row["fla_ms"] = statistics.median(t) * 1e3
                    row["ours_over_fla"] = row["ours_ms"] / row["fla_ms"]
            except Exception as e:
                row["error"] = _error(e)
            rows.append(row)
    return rows


def _timed_prefill(run: Callable[[torch.Tensor], Any], prompt: torch.Tensor, chunk: int, device: torch.device,
                   repeats: int) -> tuple[dict[str, Any], Any]:
    """Tokens per second of ``run(prompt)`` (best of ``repeats``, after a two-chunk warm-up), the peak
    of allocated device memory above what was allocated before (CUDA only); and the last result."""
    with torch.inference_mode():
        run(prompt[:, : 2 * chunk])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t, out = _seconds(lambda: run(prompt), device, repeats, warmup=0)
    r: dict[str, Any] = {"seconds": min(t), "all_seconds": t, "tok_s": prompt.shape[1] / min(t)}
    if device.type == "cuda":
        r["peak_above_weights_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return r, out


def prefill_rows(device: torch.device, kernels: dict[str, Callable], s: dict, peer: bool) -> list[dict[str, Any]]:
    from storelab.bench.prefill import build_peer, peer_prefill
    from storelab.models.model import Model, prefill
    from storelab.stores.recurrent import RecurrentStore
    from storelab.zoo import load_zoo

    rows = []
    L, chunk = s["length"], min(s["chunk"], s["length"])
    for name in PREFILL_MODELS:
        row: dict[str, Any] = {"model": name, "length": L, "chunk": chunk}
        try:
            cfg = load_zoo(name, tiny=True)
            prompt = torch.randint(0, cfg.vocab_size, (1, L), generator=torch.Generator().manual_seed(0)).to(device)
            logits = {}
            for key, flag in (("fla_off", "0"), ("fla_on", "1")):
                if flag == "1" and not kernels:
                    row[key] = {"skipped": "fla's kernels are unavailable for this device"}
                    continue
                try:
                    with _env("STORELAB_FLA", flag):  # read when the stores are built
                        torch.manual_seed(0)  # the same weights both times
                        model = Model(cfg).eval().to(device)
                    row[key], (last_BV, _) = _timed_prefill(lambda p: prefill(model, p, chunk=chunk), prompt, chunk,
                                                            device, s["prefill_repeats"])
                    row[key]["backends"] = sorted({m.backend for m in model.modules() if isinstance(m, RecurrentStore)})
                    logits[key] = last_BV.float()
                    del model
                except Exception as e:
                    row[key] = {"error": _error(e)}
            if len(logits) == 2:
                row["logits_max_abs_diff"] = _max_diff(logits["fla_on"], logits["fla_off"])
                row["fla_on_over_off"] = row["fla_on"]["tok_s"] / row["fla_off"]["tok_s"]
            if peer:
                try:
                    family, hf = build_peer(name, cfg)
                    hf = hf.to(device)
                    timed, _ = _timed_prefill(lambda p: peer_prefill(hf, p, chunk), prompt, chunk, device,
                                              s["prefill_repeats"])
                    row["peer"] = {"family": family, **timed}
                    del hf
                    best = max(row[k].get("tok_s", 0.0) for k in ("fla_on", "fla_off"))
                    row["ours_best_over_peer"] = best / row["peer"]["tok_s"]
                except Exception as e:
                    row["peer"] = {"error": _error(e)}
        except Exception as e:
            row["error"] = _error(e)
        rows.append(row)
    return rows


def command_rows(device: torch.device, s: dict) -> list[dict[str, Any]]:
    """``storelab generate`` and two probes with ``--device DEVICE --dtype bf16``, each as its own
    ``python -m storelab`` process (as a user runs them): per command its exit code, the device and dtype
    its JSON reports, and seconds (the process's start included)."""
    import subprocess
    import sys

    L = str(s["command_length"])
    commands = [["generate", "qwen3.8", "--tiny", "--prompt-len", L, "--new-tokens", "8"],
                ["probe", "state_swap", "--model", "tiny-qwen3.8", "--n", "8"],
                ["probe", "selection", "--model", "tiny-glm-5.3", "--n", "2", "--contexts", L]]
    rows = []
    for c in commands:
        args = c + ["--device", str(device), "--dtype", "bf16", "--json"]
        row: dict[str, Any] = {"command": " ".join(args)}
        t0 = time.perf_counter()
        try:
            res = subprocess.run([sys.executable, "-m", "storelab", *args], capture_output=True, text=True,
                                 timeout=300)
            row.update(exit_code=res.returncode, seconds=time.perf_counter() - t0)
            if res.returncode == 0:
                doc = json.loads(res.stdout)
                row.update(device=doc["device"], dtype=doc["dtype"])
                if c[0] == "generate":
                    row["state_bytes_equal"] = all(x["measured_bytes"] == x["analytic_bytes"] for x in doc["state"])
            else:
                row["error"] = res.stderr[-2000:]
        except Exception as e:
            row.update(exit_code=None, error=_error(e))
        rows.append(row)
    return rows


# -- the command -----------------------------------------------------------------------------------

def _table(r: dict[str, Any]) -> str:
    env = r["environment"]
    lines = [f"{env.get('device_name')} ({env['device']}), torch {torch.__version__}, fla: {env.get('fla_import')}, "
             f"kernels {env.get('fla_kernels')}" + (f", error {env['error']}" if "error" in env else "")]
    for row in r.get("correctness", []):
        lines.append(f"  {row['op']:<17} {row['dtype']}  " + (row.get("error") or
                     (f"|do| {row['o_max_abs_diff']:.2e}  |dS| {row['S_max_abs_diff']:.2e}  split |do| "
                      f"{row['split_o_max_abs_diff']:.2e}" if row.get("fla") == "ok" else "fla unavailable")))
    for row in r.get("op_timing", []):
        lines.append(f"  {row['op']:<17} {row['dtype']}  " + (row.get("error") or
                     f"ours {row['ours_ms']:.2f} ms" + (f"  fla {row['fla_ms']:.2f} ms  ours/fla "
                                                        f"{row['ours_over_fla']:.2f}" if "fla_ms" in row else "")))
    for row in r.get("commands", []):
        lines.append(f"  {row['command'][:60]:<60} exit {row['exit_code']}  "
                     + (f"{row.get('dtype')} on {row.get('device')}  {row['seconds']:.1f} s" if row['exit_code'] == 0
                        else str(row.get("error", ""))[-120:]))
    for row in r.get("prefill", []):
        parts = [f"  {row['model']:<10} {row['length']} tok"]
        for key in ("fla_on", "fla_off", "peer"):
            v = row.get(key) or {}
            parts.append(f"{key} " + (f"{v['tok_s']:.0f} tok/s" if "tok_s" in v else
                                      str(v.get("error") or v.get("skipped") or "-")[:60]))
        lines.append("  ".join(parts) + (f"  error {row['error']}" if "error" in row else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m storelab.bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="JSON file ($OUT/gpu.json if OUT is set, else ./gpu.json)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes (T=128, 2 heads of 16, 256 tokens)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--length", type=int, help="prefill tokens (default 16384, quick 256)")
    p.add_argument("--no-peer", action="store_true", help="skip transformers' model in the prefill section")
    a = p.parse_args(argv)
    sections = [x for x in a.sections.split(",") if x]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)} (known: {', '.join(SECTIONS)})")
    s = dict(QUICK if a.quick else FULL)
    if a.length:
        s["length"] = a.length
    device = torch.device(a.device)
    kernels = fla_for(device)
    r: dict[str, Any] = {"bench": "gpu", "quick": a.quick, "settings": s}
    try:
        r["environment"] = environment(device, kernels)
    except Exception as e:
        r["environment"] = {"device": str(device), "error": _error(e)}
    if "correctness" in sections:
        r["correctness"] = correctness(device, kernels, s)
    if "op_timing" in sections:
        r["op_timing"] = op_timing(device, kernels, s)
    if "prefill" in sections:
        r["prefill"] = prefill_rows(device, kernels, s, peer=not a.no_peer)
    if "commands" in sections:
        r["commands"] = command_rows(device, s)
    out = Path(a.out) if a.out else Path(os.environ["OUT"]) / "gpu.json" if os.environ.get("OUT") else Path("gpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1, default=str))
    print(_table(r))
    print(f"wrote {out}")
    return r


if __name__ == "__main__":
    main()
