"""The planted-NaN comparison of `lazuli-bench nan`, the Python side: the same residual MLP as lazuli's
(bench/src/nan.rs), trained with SGD, whose layer `planted` takes log(h*h + poison). With poison = 1 every value is
finite; at step `trip` poison is -1e30 and that log makes NaN from finite inputs.

Usage: python nan_compare.py torch|jax '{"batch":..,"dim":..,"layers":..,"planted":..,"steps":..,"trip":..}'
Prints one JSON line: the step time without and with the framework's NaN checking, and what the checking said when
the NaN came (its time from the trip step's start, its message, whether it names the planted line).
"""

import json
import sys
import time
import traceback
import warnings

import numpy as np


def weights(cfg):
    rng = np.random.default_rng(1)
    d = cfg["dim"]
    f32 = np.float32
    return [((rng.standard_normal((d, 2 * d)) * (0.5 / np.sqrt(d))).astype(f32),
             (rng.standard_normal((2 * d, d)) * (0.5 / np.sqrt(2 * d))).astype(f32))
            for _ in range(cfg["layers"])]


def batch(cfg):
    return np.random.default_rng(2).standard_normal((cfg["batch"], cfg["dim"]), dtype=np.float32)


PLANTED_LINE = None  # set below: the line of the log in each framework's forward


def run_torch(cfg):
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ws = [(torch.tensor(a, device=dev, requires_grad=True), torch.tensor(b, device=dev, requires_grad=True))
          for a, b in weights(cfg)]
    x = torch.tensor(batch(cfg), device=dev)

    def forward(poison):
        h = x
        for i, (a, b) in enumerate(ws):
            y = torch.tanh(h @ a) @ b
            if i == cfg["planted"]:
                y = torch.log(y * y + poison)  # PLANTED
            h = h + y
        return (h * h).mean()

    def step(poison):
        loss = forward(poison)
        loss.backward()
        with torch.no_grad():
            for a, b in ws:
                a -= 1e-3 * a.grad
                b -= 1e-3 * b.grad
                a.grad = None
                b.grad = None
        return loss

    def timed(n, anomaly):
        for _ in range(2):
            with torch.autograd.set_detect_anomaly(anomaly):
                step(1.0).item()
        torch.cuda.synchronize() if dev == "cuda" else None
        t0 = time.perf_counter()
        for _ in range(n):
            with torch.autograd.set_detect_anomaly(anomaly):
                step(1.0).item()
        return (time.perf_counter() - t0) / n

    plain = timed(cfg["steps"], False)
    checked = timed(cfg["steps"], True)
    caught = warnings.catch_warnings(record=True)
    log = caught.__enter__()
    warnings.simplefilter("always")
    t0 = time.perf_counter()
    message, named = "no error", False
    try:
        with torch.autograd.set_detect_anomaly(True):
            step(-1e30).item()
    except Exception as e:  # detect_anomaly raises in backward
        text = str(e) + "".join(str(w.message) for w in log)
        message = str(e).splitlines()[0]
        named = f"line {PLANTED_LINE['torch']}" in text or f":{PLANTED_LINE['torch']}" in text
    took = time.perf_counter() - t0
    caught.__exit__(None, None, None)
    return {"framework": f"PyTorch {torch.__version__} eager, torch.autograd.detect_anomaly", "device": dev,
            "plain_s": plain, "checked_s": checked, "trip_s": took, "message": message, "names_line": named}


def run_jax(cfg):
    import jax
    import jax.numpy as jnp

    ws = [(jnp.asarray(a), jnp.asarray(b)) for a, b in weights(cfg)]
    x = jnp.asarray(batch(cfg))

    def loss_fn(ws, poison):
        h = x
        for i, (a, b) in enumerate(ws):
            y = jnp.tanh(h @ a) @ b
            if i == cfg["planted"]:
                y = jnp.log(y * y + poison)  # PLANTED
            h = h + y
        return (h * h).mean()

    @jax.jit
    def step(ws, poison):
        loss, g = jax.value_and_grad(loss_fn)(ws, poison)
        return [(a - 1e-3 * ga, b - 1e-3 * gb) for (a, b), (ga, gb) in zip(ws, g)], loss

    def timed(n):
        nonlocal ws
        for _ in range(2):
            ws, loss = step(ws, jnp.float32(1.0))
            float(loss)
        t0 = time.perf_counter()
        for _ in range(n):
            ws, loss = step(ws, jnp.float32(1.0))
            float(loss)
        return (time.perf_counter() - t0) / n

    plain = timed(cfg["steps"])
    jax.config.update("jax_debug_nans", True)
    checked = timed(cfg["steps"])
    t0 = time.perf_counter()
    message, named = "no error", False
    try:
        ws2, loss = step(ws, jnp.float32(-1e30))
        float(loss)
    except Exception as e:  # FloatingPointError after the op-by-op re-run
        text = traceback.format_exc()
        message = str(e).splitlines()[0]
        named = f"line {PLANTED_LINE['jax']}" in text
    took = time.perf_counter() - t0
    return {"framework": f"JAX {jax.__version__} jit, jax_debug_nans", "device": str(jax.devices()[0].platform),
            "plain_s": plain, "checked_s": checked, "trip_s": took, "message": message, "names_line": named}


def planted_lines():
    lines = open(__file__).read().splitlines()
    found = [i + 1 for i, l in enumerate(lines) if l.strip().endswith("# PLANTED")]
    return {"torch": found[0], "jax": found[1]}


if __name__ == "__main__":
    PLANTED_LINE = planted_lines()
    which, cfg = sys.argv[1], json.loads(sys.argv[2])
    out = run_torch(cfg) if which == "torch" else run_jax(cfg)
    out["planted_line"] = PLANTED_LINE[which]
    print(json.dumps(out))
