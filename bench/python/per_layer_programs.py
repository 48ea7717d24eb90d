"""GPT-2 small's gradients in JAX three ways: one unrolled program, `lax.scan` over stacked layers, and a program per
layer (one block's forward, returning its output and its vjp's residuals, and one block's backward, each compiled
once and called per layer from the host, the embedding and the head as programs of their own). Forward and
backward only, no optimizer; random weights; the gradients of the two other forms are compared with the unrolled
one's. A check of lazuli's design for scanned blocks (docs/perf-log/2026-12-03-split-step-under-stop.md), not part
of the harness.

    python3 bench/python/per_layer_programs.py [layers]     # GPT-2 small's width, B=8, T=1024, cuDNN attention
    SMALL=1 python3 bench/python/per_layer_programs.py 3    # a tiny model, for a dry run on a CPU
"""
import math
import os
import sys
import time

import jax
import jax.numpy as jnp

L = int(sys.argv[1]) if len(sys.argv) > 1 else 12
B, T, D, H, V = (2, 64, 64, 4, 128) if os.environ.get("SMALL") else (8, 1024, 768, 12, 50304)
IMPL = "cudnn" if jax.devices()[0].platform == "gpu" else "xla"
hd = D // H
bf = jnp.bfloat16
key = jax.random.PRNGKey(0)


def mm(a, b):
    return jnp.matmul(a.astype(bf), b.astype(bf)).astype(jnp.float32)


def ln(x, w, b):
    c = x - x.mean(-1, keepdims=True)
    var = (c * c).mean(-1, keepdims=True)
    return c * jax.lax.rsqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def block(q, x):
    h = ln(x, q["ln1w"], q["ln1b"])
    qkv = (mm(h, q["qkv"]) + q["qkvb"]).reshape(B, T, 3, H, hd).astype(bf)
    y = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True,
                                     implementation=IMPL).astype(jnp.float32).reshape(B, T, D)
    x = x + mm(y, q["proj"]) + q["projb"]
    h = ln(x, q["ln2w"], q["ln2b"])
    h = gelu(mm(h, q["fc"]) + q["fcb"])
    return x + mm(h, q["fc2"]) + q["fc2b"]


def init_layer(k):
    ks = jax.random.split(k, 4)
    n = lambda k, s: jax.random.normal(k, s, jnp.float32) * 0.02
    return {"ln1w": jnp.ones(D), "ln1b": jnp.zeros(D), "qkv": n(ks[0], (D, 3 * D)), "qkvb": jnp.zeros(3 * D),
            "proj": n(ks[1], (D, D)), "projb": jnp.zeros(D), "ln2w": jnp.ones(D), "ln2b": jnp.zeros(D),
            "fc": n(ks[2], (D, 4 * D)), "fcb": jnp.zeros(4 * D), "fc2": n(ks[3], (4 * D, D)), "fc2b": jnp.zeros(D)}


ks = jax.random.split(key, L + 3)
layers = [init_layer(ks[i]) for i in range(L)]
head = {"wte": jax.random.normal(ks[L], (V, D)) * 0.02, "wpe": jax.random.normal(ks[L + 1], (T, D)) * 0.01,
        "lnfw": jnp.ones(D), "lnfb": jnp.zeros(D)}
ids = jax.random.randint(ks[L + 2], (B, T), 0, V)
tgt = jnp.roll(ids, -1, axis=1)


def embed(hp, ids):
    return hp["wte"][ids] + hp["wpe"][jnp.arange(T)]


def head_loss(hp, x, tgt):
    x = ln(x, hp["lnfw"], hp["lnfb"])
    logits = mm(x, hp["wte"].T).reshape(B * T, V)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(lsm, tgt.reshape(-1)[:, None], axis=1))


def loss_unrolled(hp, layers, ids, tgt):
    x = embed(hp, ids)
    for q in layers:
        x = block(q, x)
    return head_loss(hp, x, tgt)


def loss_scan(hp, stacked, ids, tgt):
    x = embed(hp, ids)
    x, _ = jax.lax.scan(lambda x, q: (block(q, x), None), x, stacked)
    return head_loss(hp, x, tgt)


unrolled = jax.jit(jax.value_and_grad(loss_unrolled, argnums=(0, 1)))
scanned = jax.jit(jax.value_and_grad(loss_scan, argnums=(0, 1)))
stacked = {k: jnp.stack([q[k] for q in layers]) for k in layers[0]}

# Regional: the block's forward returns its output and its vjp's residuals; its backward takes them.
embed_fwd = jax.jit(lambda hp, ids: jax.vjp(lambda hp: embed(hp, ids), hp))
block_fwd = jax.jit(lambda q, x: jax.vjp(block, q, x))
block_bwd = jax.jit(lambda f, g: f(g))
head_vg = jax.jit(jax.value_and_grad(head_loss, argnums=(0, 1)))
embed_bwd = jax.jit(lambda f, g: f(g)[0])
add_trees = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b))


def regional(hp, layers, ids, tgt):
    x, efn = embed_fwd(hp, ids)
    fns = []
    for q in layers:
        x, f = block_fwd(q, x)
        fns.append(f)
    loss, (ghp, g) = head_vg(hp, x, tgt)
    grads = [None] * L
    for i in reversed(range(L)):
        grads[i], g = block_bwd(fns[i], g)
    ghp = add_trees(ghp, embed_bwd(efn, g))
    return loss, (ghp, grads)


def timeit(name, fn, args, steps=10, reps=3):
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    first = time.perf_counter() - t0
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    res = {}
    for mode in ("waiting", "pipelined"):
        meds = []
        for _ in range(reps):
            ts = []
            if mode == "waiting":
                for _ in range(steps):
                    t = time.perf_counter()
                    jax.block_until_ready(fn(*args))
                    ts.append(time.perf_counter() - t)
                meds.append(sorted(ts)[len(ts) // 2])
            else:
                t = time.perf_counter()
                outs = [fn(*args) for _ in range(steps)]
                jax.block_until_ready(outs)
                meds.append((time.perf_counter() - t) / steps)
        res[mode] = sorted(meds)[len(meds) // 2] * 1e3
    print(f"{name:10s} L={L} first {first:6.2f} s  waiting {res['waiting']:6.2f} ms  pipelined {res['pipelined']:6.2f} ms  loss {float(out[0]):.5f}", flush=True)
    return out


a = timeit("unrolled", unrolled, (head, layers, ids, tgt))
b = timeit("scan", scanned, (head, stacked, ids, tgt))
c = timeit("per layer", regional, (head, layers, ids, tgt))
# The gradients agree (relative max difference of one layer's fc weight and the embedding).
for name, o in (("scan", b), ("per layer", c)):
    g_fc = o[1][1]["fc"][L // 2] if name == "scan" else o[1][1][L // 2]["fc"]
    ref = a[1][1][L // 2]["fc"]
    print(name, "max rel diff fc", float(jnp.max(jnp.abs(g_fc - ref)) / jnp.max(jnp.abs(ref))),
          "wte", float(jnp.max(jnp.abs(o[1][0]["wte"] - a[1][0]["wte"])) / jnp.max(jnp.abs(a[1][0]["wte"]))))
