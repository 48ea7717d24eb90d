"""Attention alone at one shape, forward and forward+backward, in JAX (cuDNN) and PyTorch (SDPA), for
`lazuli-bench attention`. Prints one JSON line per implementation: {"name", "fwd_ms", "fwd_bwd_ms"}.

    python attention.py B T H D ITERS CAUSAL
Inputs are bf16, causal when CAUSAL is 1 (no mask when 0); the backward is the gradient of sum(out * w) with respect to q, k and v. Timed as
lazuli's side is: ITERS calls back to back, one wait for the last, divided by ITERS; the median of 5 such runs
after a warm-up.
"""

import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def median_ms(run, ready, iters, reps=5):
    for _ in range(3):
        ready(run())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = run()
        ready(out)
        times.append((time.perf_counter() - t0) * 1e3 / iters)
    times.sort()
    return times[len(times) // 2]


def jax_rows(b, t, h, d, iters, causal):
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v = (jax.random.normal(kk, (b, t, h, d), jnp.bfloat16) for kk in keys[:3])
    w = jax.random.normal(keys[3], (b, t, h, d), jnp.float32)
    on_gpu = jax.devices()[0].platform == "gpu"
    impl = "cudnn" if on_gpu else "xla"

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)

    fwd = jax.jit(attend)
    grad = jax.jit(jax.grad(lambda q, k, v: (attend(q, k, v).astype(jnp.float32) * w).sum(), argnums=(0, 1, 2)))
    ready = lambda x: jax.block_until_ready(x)
    yield {"name": f"JAX jit, dot_product_attention(implementation=\"{impl}\")",
           "fwd_ms": median_ms(lambda: fwd(q, k, v), ready, iters),
           "fwd_bwd_ms": median_ms(lambda: grad(q, k, v), ready, iters)}


def torch_rows(b, t, h, d, iters, causal):
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        return
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    w = torch.randn(b, h, t, d, device=dev, generator=g)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    ready = lambda _: torch.cuda.synchronize()

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        return torch.autograd.grad((out.float() * w).sum(), leaves)

    yield {"name": "PyTorch, F.scaled_dot_product_attention (its choice of kernel)",
           "fwd_ms": median_ms(fwd, ready, iters), "fwd_bwd_ms": median_ms(fwd_bwd, ready, iters)}


def main():
    b, t, h, d, iters, causal = (int(x) for x in sys.argv[1:7])
    for rows in (jax_rows, torch_rows):
        try:
            for row in rows(b, t, h, d, iters, bool(causal)):
                print(json.dumps(row), flush=True)
        except Exception as e:  # one framework failing still reports the other
            print(json.dumps({"name": rows.__name__, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
