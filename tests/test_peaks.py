"""The measured gate of the commands whose size the user sets (issue 38, item 3): the fit, the profiler's
count, the trial's cases refused with the option named and a small peak, and estimates held against
the resident peak a run really reaches (in a fresh process)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
import torch

from storelab.models import peaks


def test_extrapolate_reads_a_parabola_exactly_and_a_bending_down_fit_as_the_line_above_it():
    f = lambda x: 5 + 3 * x + 0.5 * x * x  # noqa: E731
    assert peaks.extrapolate([(x, f(x)) for x in (1, 2, 4)], 100) == pytest.approx(f(100))
    capped = [(1, 10), (2, 20), (4, 24)]          # a transient that a budget caps: concave
    line = 24 + (24 - 20) / 2 * (100 - 4)
    assert peaks.extrapolate(capped, 100) == pytest.approx(line)
    assert peaks.extrapolate([(1, 10), (2, 8), (4, 6)], 100) >= 6   # never below the largest measurement
    assert peaks.extrapolate([(1, 4), (2, 6)], 10) == pytest.approx(22)


def test_tensor_peak_counts_what_is_held_at_once():
    n = 4 << 20

    def work():
        a = torch.ones(n // 4)          # 4 MiB
        b = torch.ones(n // 4)          # 8 MiB at once
        del a, b
        return torch.ones(n // 8)       # 2 MiB after both are freed

    got = peaks.tensor_peak(work)
    assert 2 * n <= got < 2 * n + (1 << 20)


def _child(code: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, float]:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return p, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


@pytest.mark.parametrize("args, option", [
    (["generate", "tiny-glm-5.3", "--prompt-len", "1000000"], "--prompt-len"),
    (["probe", "mhc", "--model", "tiny-deepseek-v4-pro", "--contexts", "5000000"], "--contexts"),
    (["probe", "selection", "--model", "tiny-glm-5.3", "--contexts", "2000000"], "--contexts"),
])
def test_the_trials_sizes_are_refused_before_the_work_naming_the_option(args, option):
    code = ("import resource, sys; from storelab.cli import main; sys.argv = ['storelab'] + %r\n"
            "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024); sys.exit(code)" % args)
    p, _ = _child(code)
    assert p.returncode == 2, p.stderr[-2000:] + p.stdout[-2000:]
    assert option in (p.stderr + p.stdout) and "Traceback" not in p.stderr
    peak = int(p.stdout.split("PEAK")[-1].split()[0])
    assert peak < 1 << 30, peak


MEASURE = """
import json, sys, gc, ctypes, torch
torch.set_num_threads(1)
from storelab.train.models import resolve_model
from storelab.models.model import Model, generate
from storelab.models import peaks
from storelab.probes.selection_sweep import selection_sweep
from storelab.tasks import make_task
def status(f):
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(f))
mode, name, C = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = make_task('dictionary', 'tiny'); cfg = resolve_model(name, t.vocab_size); torch.manual_seed(0)
net = Model(cfg).eval(); docs = [r.tolist() for r in t.sample(64, 1).inputs]
if mode == 'generate':
    est = peaks.generate_tensors(net, prompt_len=C, new_tokens=4, chunk=0)
    run = lambda: generate(net, torch.randint(0, cfg.vocab_size, (1, C)), 4)
else:
    est = peaks.fitted_tensors(lambda x: selection_sweep(net, docs, contexts=(x,), queries=64), (1024, 2048, 3072), C)
    run = lambda: selection_sweep(net, docs, contexts=(C,), queries=64)
gc.collect(); ctypes.CDLL('libc.so.6').malloc_trim(0)
open('/proc/self/clear_refs', 'w').write('5'); base = status('VmRSS')
with torch.inference_mode():
    run()
print('RESULT', json.dumps({'estimate': peaks.MARGIN * est + peaks.OVERHEAD, 'measured': status('VmHWM') - base}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self for the resident peak")
@pytest.mark.parametrize("mode, name, size", [("generate", "tiny-qwen3.8", 12000),
                                              ("selection", "tiny-minimax-m3", 12000)])
def test_the_estimate_holds_the_resident_peak_the_run_reaches(mode, name, size):
    p = subprocess.run([sys.executable, "-c", MEASURE, mode, name, str(size)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.split("RESULT")[-1])
    assert r["measured"] <= r["estimate"] <= 4 * r["measured"] + peaks.OVERHEAD, r


READ = """
import json, torch
torch.set_num_threads(1)
from storelab.models import peaks
from storelab.stores.compressed import CompressedAttention, HCAConfig
def status(f):
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(f))
torch.manual_seed(0)
st = CompressedAttention(HCAConfig(d_model=64, n_heads=4, head_dim=32, rope_dim=8, q_lora=24, o_groups=2,
                                   o_lora=16, pool=4, window=4)).eval()
x = torch.randn(8, 8192, 64)
base = status('VmRSS')
with torch.inference_mode():
    st(x)
grew = status('VmHWM') - base
print('RESULT', json.dumps({'grew': grew, 'tensors': peaks.tensor_peak(lambda: st(x))}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self for the resident peak")
def test_a_long_chunked_read_holds_its_tensors_not_the_sum_of_its_chunks():
    # 8 rows of 8,192 tokens: the HCA read runs one query a chunk, each over more entries than the last. It used
    # to keep every chunk's output and decode the entries anew per chunk: glibc's heap grew to 4.3x the tensors'
    # peak (513 MiB for 120), and probe mhc on the tiny DeepSeek-V4 passed its estimate past 4,096 tokens
    p = subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.split("RESULT")[-1])
    assert r["grew"] <= peaks.MARGIN * r["tensors"], r
