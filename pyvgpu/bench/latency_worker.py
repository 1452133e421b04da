"""The decode service of `pyvgpu bench latency`: requests arriving at random, served one at a time.

    python -m pyvgpu.bench.latency_worker SECONDS RATE TOKENS SEED

A GPT-2-small-shaped model (12 layers, width 768, random weights from a config: no download, fp16) answers
requests of one 32-token prompt with TOKENS new tokens (greedy). Requests arrive as a Poisson process of
RATE a second (the schedule is fixed by SEED, so every scenario sees the same arrivals); a request that
arrives while another is served waits for it, and its latency counts the wait, as a user's would.

Prints one line per request, ``L <arrival ns> <latency ns> <service ns>`` (CLOCK_MONOTONIC; service: from
its start to its last token), after three warm-up requests that are not counted.
"""

from __future__ import annotations

import random
import sys
import time

PROMPT = 32
WARMUP = 3


def arrivals(seconds: float, rate: float, seed: int) -> list[int]:
    """The arrival offsets (ns from the start) of a Poisson process of ``rate`` a second over ``seconds``."""
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"rate {rate} and seconds {seconds} must be positive")
    rnd = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rnd.expovariate(rate)
        if t >= seconds:
            return out
        out.append(int(t * 1e9))


def _model(torch):
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.float16).eval(), cfg.vocab_size


def _quit(message: str) -> None:
    """One line on stderr and exit status 2: the service could not run (no traceback)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    usage = "usage: python -m pyvgpu.bench.latency_worker SECONDS RATE TOKENS SEED"
    if len(sys.argv) != 5:
        _quit(usage)
    try:
        seconds, rate, tokens, seed = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        schedule = arrivals(seconds, rate, seed)
    except ValueError as e:
        _quit(f"latency_worker: {e} ({usage})")
    if tokens < 1:
        _quit(f"latency_worker: TOKENS {tokens}: give 1 or more new tokens a request")
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        _quit(f"the decode service needs PyTorch and transformers ({e.name} is missing)")
    if not torch.cuda.is_available():
        _quit("the decode service needs a CUDA GPU (torch.cuda.is_available() is False)")

    model, vocab = _model(torch)
    ids = torch.randint(0, vocab, (1, PROMPT), device="cuda")
    mask = torch.ones_like(ids)

    def serve() -> None:
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()

    for _ in range(WARMUP):
        serve()
    t0 = time.monotonic_ns()
    for offset in schedule:
        due = t0 + offset
        now = time.monotonic_ns()
        if now < due:
            time.sleep((due - now) / 1e9)
        start = time.monotonic_ns()
        serve()
        end = time.monotonic_ns()
        print(f"L {due} {end - due} {end - start}", flush=True)


if __name__ == "__main__":
    main()
