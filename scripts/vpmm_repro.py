"""Issue 32's crash, as the issue ran it: prints PASS, or FAIL with the error.

    python scripts/vpmm_repro.py [--seconds 16] [--runs 1] [--allocator vpmm|default|expandable_segments]
                                 [--memory 40G] [--empty-cache] [--torch-decoder] [--context pool|caller]

Under `pyvgpu wrap --memory 40G --allocator vpmm` (the default), decode for --seconds with transformers'
GPT-2 architecture (8 layers, width 1024, fp16, random weights from a config: nothing is downloaded), batch
1-32, prompt 16-512, 16-64 new tokens at random; then delete the model, build 8 x Linear 2048 (fp32, batch
1024, Adam) and train for 5 s. Before the fix the first training allocation failed with "pyvgpu VPMM:
malloc(8388608) on device 0 failed: CUresult 201". Needs the installed pyvgpu, PyTorch, transformers (or
--torch-decoder: a decoder of the same shape in plain PyTorch) and a GPU. Exit status: 0 PASS, 1 FAIL,
2 could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=16.0, help="decoding time before the training loop")
    ap.add_argument("--runs", type=int, default=1, help="how many times (each its own process)")
    ap.add_argument("--allocator", choices=("vpmm", "default", "expandable_segments"), default="vpmm")
    ap.add_argument("--memory", default="40G", help="the wrap's --memory cap ('' for none)")
    ap.add_argument("--empty-cache", action="store_true", help="empty_cache() between the two loops")
    ap.add_argument("--torch-decoder", action="store_true", help="decode with plain PyTorch, not transformers")
    ap.add_argument("--context", choices=("pool", "caller"), default="pool",
                    help="VPMM_CONTEXT: 'caller' makes VPMM's driver calls in the calling thread's context, as "
                         "before the fix (to see the failure again)")
    a = ap.parse_args()
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["VPMM_CONTEXT"] = a.context
    if a.torch_decoder:
        env["PYVGPU_DECODE"] = "torch"
    else:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("vpmm_repro: the issue's loop needs transformers (pip install transformers), or pass "
                  "--torch-decoder", file=sys.stderr)
            return 2
    wrap = [sys.executable, "-m", "pyvgpu", "wrap"] + (["--memory", a.memory] if a.memory else [])
    if a.allocator == "vpmm":
        wrap += ["--allocator", "vpmm"]
    elif a.allocator == "expandable_segments":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    loop = [sys.executable, "-m", "pyvgpu.bench.vpmm_loops", "repro", str(a.seconds)]
    failed = 0
    for run in range(a.runs):
        p = subprocess.run([*wrap, "--", *loop, str(run), *(["--empty-cache"] if a.empty_cache else [])], env=env,
                           capture_output=True, text=True, timeout=max(600, 4 * a.seconds + 300))
        lines = p.stdout.strip().splitlines()
        if p.returncode != 0 and not lines:
            print(f"run {run + 1}: could not run (exit {p.returncode}): {p.stderr.strip()[-1500:]}")
            return 2
        r = json.loads(lines[-1])
        d = r.get("decode") or {"seconds": 0.0, "generate_calls": 0, "tokens_per_s": 0.0}
        head = (f"run {run + 1}: {a.allocator}, {r.get('model')}, decoded {d['seconds']:.1f} s "
                f"({d['generate_calls']} generate calls, {d['tokens_per_s']:.0f} tokens/s), peak reserved "
                f"{r['peak_reserved'] / 2**30:.2f} GiB")
        if "pool" in r:
            pl = r["pool"]
            head += (f"; pool: {pl['context_switches']} calls switched context ({pl['entered_without_context']} "
                     f"from a thread without one, {pl['entered_with_another_context']} from another)")
        print(head)
        if r.get("ok"):
            t = r["train"]
            print(f"PASS: then trained {t['steps']} steps ({t['steps_per_s']:.1f} steps/s, loss {t['loss']:.4f})")
        else:
            failed += 1
            print(f"FAIL in {r.get('phase')}: {r.get('error')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
