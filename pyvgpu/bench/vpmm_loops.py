"""Real PyTorch loops for VPMM (issue 32): varying-shape decoding, a training loop, and the issue's sequence.

    python -m pyvgpu.bench.vpmm_loops decode SECONDS [SEED]   transformers' generate, GPT-2 architecture
    python -m pyvgpu.bench.vpmm_loops train SECONDS [SEED]    8 x Linear 2048 (fp32, batch 1024), Adam
    python -m pyvgpu.bench.vpmm_loops repro SECONDS [SEED] [--empty-cache]
                                      decode for SECONDS, delete the model, train 8 x Linear 2048 for 5 s

Each prints one JSON line: throughput, peak reserved (torch.cuda.max_memory_reserved; under VPMM every
byte the pool took) and, under VPMM, the pool's figures. Run them under `pyvgpu wrap` (with
`--allocator vpmm` for VPMM): `pyvgpu bench vpmm --workload decode|train` does, for the three allocators,
interleaved. Weights are random, from a config: nothing is downloaded. ``decode`` uses transformers when it
is installed and ``PYVGPU_DECODE=torch`` does not ask otherwise; without it, a decoder of the same shape in
plain PyTorch (a KV cache grown by torch.cat each token, as transformers' DynamicCache does).
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time
from typing import Any

from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError

# the shapes: GPT-2 architecture, 8 layers of width 1024, fp16; batch 1-32, prompt 16-512, 16-64 new
LAYERS, WIDTH, HEADS, VOCAB = 8, 1024, 16, 50257
BATCH, PROMPT, NEW = (1, 32), (16, 512), (16, 64)
MLP_WIDTH, MLP_LAYERS, MLP_BATCH = 2048, 8, 1024


def need_gpu() -> Any:
    """torch, with a CUDA device; a clear error otherwise."""
    try:
        import torch
    except ImportError:
        raise PyvgpuError("the VPMM loops need PyTorch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise PyvgpuError("the VPMM loops need a CUDA GPU: torch.cuda.is_available() is False")
    return torch


def use_transformers() -> bool:
    if os.environ.get(envspec.DECODE.name, "") == "torch":
        return False
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


# --- decoding ----------------------------------------------------------------------------------

def gpt2(torch: Any) -> Any:
    """transformers' GPT-2 with the issue's shape, random weights (from a config), fp16, on cuda:0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, n_positions=PROMPT[1] + NEW[1] + 64,
                     vocab_size=VOCAB)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(dtype=torch.float16, device="cuda").eval()
    return model


class TorchDecoder:
    """A decoder of GPT-2's shape in plain PyTorch: per layer, attention over a KV cache that torch.cat grows
    by one token per step, and an MLP of 4x width; fp16, random weights."""

    def __init__(self, torch: Any) -> None:
        g = torch.Generator(device="cuda").manual_seed(0)
        kw = {"device": "cuda", "dtype": torch.float16, "generator": g}
        s = WIDTH ** -0.5
        self.torch = torch
        self.emb = torch.randn(VOCAB, WIDTH, **kw) * 0.02
        self.layers = [(torch.randn(WIDTH, 3 * WIDTH, **kw) * s, torch.randn(WIDTH, WIDTH, **kw) * s,
                        torch.randn(WIDTH, 4 * WIDTH, **kw) * s, torch.randn(4 * WIDTH, WIDTH, **kw) * s * 0.5)
                       for _ in range(LAYERS)]

    def _step(self, x: Any, cache: list) -> Any:
        F = self.torch.nn.functional
        b, t, _ = x.shape
        for li, (qkv_w, o_w, up, down) in enumerate(self.layers):
            h = F.layer_norm(x, (WIDTH,))
            q, k, v = (h @ qkv_w).split(WIDTH, dim=-1)
            q, k, v = (z.view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for z in (q, k, v))
            if cache[li] is not None:
                k = self.torch.cat([cache[li][0], k], dim=2)
                v = self.torch.cat([cache[li][1], v], dim=2)
            cache[li] = (k, v)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=cache[li][0].shape[2] == t)
            x = x + a.transpose(1, 2).reshape(b, t, WIDTH) @ o_w
            x = x + F.gelu(F.layer_norm(x, (WIDTH,)) @ up) @ down
        return x

    def generate(self, ids: Any, new: int) -> Any:
        cache: list = [None] * LAYERS
        x = self.emb[ids]
        out = []
        with self.torch.no_grad():
            for _ in range(new):
                h = self._step(x, cache)
                nxt = (h[:, -1] @ self.emb.T).argmax(-1)
                out.append(nxt)
                x = self.emb[nxt].unsqueeze(1)
        return self.torch.stack(out, 1)


def decode_model(torch: Any) -> tuple[Any, str]:
    if use_transformers():
        return gpt2(torch), "transformers GPT-2"
    return TorchDecoder(torch), "plain PyTorch decoder"


def decode(torch: Any, model: Any, seconds: float, rnd: random.Random) -> dict:
    """Generate with random batch, prompt and new-token counts (the issue's ranges) for ``seconds``."""
    tokens = calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b, p, n = rnd.randint(*BATCH), rnd.randint(*PROMPT), rnd.randint(*NEW)
        ids = torch.randint(0, VOCAB, (b, p), device="cuda")
        with torch.no_grad():
            if hasattr(model, "config"):  # transformers
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                     min_new_tokens=n, do_sample=False, pad_token_id=0)
                made = out.shape[1] - p
            else:
                made = model.generate(ids, n).shape[1]
        tokens += b * made
        calls += 1
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    return {"tokens": tokens, "generate_calls": calls, "seconds": took, "tokens_per_s": tokens / took}


# --- training ----------------------------------------------------------------------------------

def mlp(torch: Any) -> Any:
    layers: list = []
    for i in range(MLP_LAYERS):
        layers.append(torch.nn.Linear(MLP_WIDTH, MLP_WIDTH))
        if i < MLP_LAYERS - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def train(torch: Any, model: Any, seconds: float, steps: int = 0) -> dict:
    """Adam steps on random data (batch 1024) for ``seconds`` (or ``steps`` steps). The phase of a failure
    is named: the issue's crash came at the first allocation of this loop."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    n = 0
    loss = None
    t0 = time.perf_counter()
    phase = "data"
    try:
        while (steps and n < steps) or (not steps and time.perf_counter() - t0 < seconds):
            phase = "data"
            x = torch.randn(MLP_BATCH, MLP_WIDTH, device="cuda")
            phase = "forward"
            loss = (model(x) - x).pow(2).mean()
            phase = "backward (autograd's worker thread)"
            opt.zero_grad(set_to_none=True)
            loss.backward()
            phase = "optimizer step"
            opt.step()
            n += 1
        torch.cuda.synchronize()
    except RuntimeError as e:
        raise LoopError(phase, n, e) from e
    took = time.perf_counter() - t0
    return {"steps": n, "seconds": took, "steps_per_s": n / took, "loss": loss.item() if loss is not None else None}


class LoopError(RuntimeError):
    def __init__(self, phase: str, step: int, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__} in the training loop, step {step}, {phase}: {error}")
        self.phase, self.step, self.error = phase, step, error


# --- what a run reports -------------------------------------------------------------------------

def pools() -> list:
    from pyvgpu.vpmm import pool as vpmm

    return vpmm._TORCH_POOLS


def allocator() -> str:
    if pools():
        return "vpmm"
    conf = os.environ.get(envspec.PYTORCH_CUDA_ALLOC_CONF.name, "")
    return "expandable_segments" if "expandable_segments:True" in conf.replace(" ", "") else "default"


POOL_KEYS = ("pages", "mapped", "live", "peak_taken", "defragmentations", "vmm_calls", "trims", "ooms",
             "context_switches", "entered_without_context", "entered_with_another_context")


def figures(torch: Any) -> dict:
    out = {"allocator": allocator(), "peak_reserved": torch.cuda.max_memory_reserved(),
           "peak_allocated": torch.cuda.max_memory_allocated(), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__}
    if pools():
        st = pools()[0].stats()
        out["pool"] = {k: st.get(k) for k in POOL_KEYS}
    return out


def run_decode(seconds: float, seed: int) -> dict:
    torch = need_gpu()
    model, kind = decode_model(torch)
    decode(torch, model, min(2.0, seconds / 4), random.Random(seed + 1))  # warm-up: kernels loaded, cuBLAS ready
    torch.cuda.reset_peak_memory_stats()
    r = decode(torch, model, seconds, random.Random(seed))
    return {"workload": "decode", "model": kind, **r, **figures(torch)}


def run_train(seconds: float, seed: int) -> dict:
    torch = need_gpu()
    torch.manual_seed(seed)
    model = mlp(torch)
    train(torch, model, 0, steps=5)  # warm-up
    torch.cuda.reset_peak_memory_stats()
    r = train(torch, model, seconds)
    return {"workload": "train", **r, **figures(torch)}


def run_repro(seconds: float, seed: int, train_seconds: float = 5.0, empty_cache: bool = False) -> dict:
    """The issue's sequence: decode with varying shapes for ``seconds``, delete the model, build the
    8 x Linear 2048 training loop and train. ``ok`` False with ``error`` and ``phase`` on a failure."""
    torch = need_gpu()
    out: dict = {"workload": "repro", "decode_seconds": seconds}
    try:
        model, out["model"] = decode_model(torch)
        out["decode"] = decode(torch, model, seconds, random.Random(seed))
    except RuntimeError as e:
        out.update(ok=False, phase="decode", error=str(e), **figures(torch))
        return out
    del model
    gc.collect()
    if empty_cache:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        net = mlp(torch)
    except RuntimeError as e:
        out.update(ok=False, phase="building the training model", error=str(e), **figures(torch))
        return out
    try:
        out["train"] = train(torch, net, train_seconds)
        out["ok"] = True
    except LoopError as e:
        out.update(ok=False, phase=e.phase, step=e.step, error=str(e.error))
    out.update(figures(torch))
    return out


def main(argv: list[str]) -> int:
    empty = "--empty-cache" in argv  # repro: empty_cache() between the two loops
    argv = [a for a in argv if a != "--empty-cache"]
    if len(argv) < 2 or argv[0] not in ("decode", "train", "repro"):
        print("usage: python -m pyvgpu.bench.vpmm_loops decode|train|repro SECONDS [SEED] [--empty-cache]",
              file=sys.stderr)
        return 2
    try:
        seconds = float(argv[1])
        seed = int(argv[2]) if len(argv) > 2 else 0
    except ValueError:
        print(f"vpmm_loops: SECONDS {argv[1]!r} and SEED must be numbers", file=sys.stderr)
        return 2
    try:
        if argv[0] == "repro":
            r = run_repro(seconds, seed, empty_cache=empty)
        else:
            r = {"decode": run_decode, "train": run_train}[argv[0]](seconds, seed)
    except PyvgpuError as e:
        print(f"pyvgpu: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r))
    return 0 if r.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
