"""Comparison side of lazuli's benchmark harness: the same workloads in JAX (jit) or PyTorch (torch.compile).

The harness (bench/src) starts this script once per framework and talks to it in JSON lines on stdin/stdout:
  {"cmd": "setup", "workload": {...}, "weights": "file.safetensors"}  -> {"ok": true, "versions": {...}, ...}
  {"cmd": "run", "steps": K, "pipelined": B}                                        -> {"ok": true, "times": [...], "losses": [...]}
  {"cmd": "profile", "steps": K, "dir": "out"}  -> {"ok": true}  (JAX: K steps under jax.profiler, trace in dir)
  {"cmd": "quit"}
Weights and batches come from a safetensors file that lazuli wrote ("model.<name>", "extra.x", "extra.y"), so
both sides start from the same values. Each step is timed from the call until its results are ready on the device.
Everything is float32 except matmul operands where the workload asks for bf16 ("bf16_matmul"), and q, k, v
where it asks for fused attention ("attention": "fused"; default "written": scores, mask, softmax, weighted sum).
"""

import json
import math
import os
import sys
import time

import numpy as np
from safetensors.numpy import load_file


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def adamw_scalars(opt, t):
    """Host-side scalars of step t (1-based), as lazuli computes them (f64, rounded to f32 when used)."""
    bc1 = 1.0 - opt["beta1"] ** t
    bc2 = 1.0 - opt["beta2"] ** t
    return {
        "step_size": opt["lr"] / bc1,
        "inv_sqrt_bc2": 1.0 / math.sqrt(bc2),
        "decay": 1.0 - opt["lr"] * opt["weight_decay"],
    }


def timed_steps(steps, pipelined, prepare, launch, wait):
    """Run `steps` steps: `prepare()` (untimed: batch choice, host scalars), `launch(prepared)` -> loss, and
    `wait(loss)` until it is ready. Each step is timed until its loss is ready, or, pipelined, all of them back to
    back until the last is ready, every step getting the mean (lazuli's harness does the same). With
    LAZULI_BENCH_READ_LOSS=1 every step reads its loss as a Python float instead, as a loop that logs it does."""
    read = os.environ.get("LAZULI_BENCH_READ_LOSS") == "1"
    times, losses = [], []
    start = time.perf_counter()
    for _ in range(steps):
        prepared = prepare()
        t0 = time.perf_counter()
        loss = launch(prepared)
        if read:
            float(loss)
        elif not pipelined:
            wait(loss)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    if pipelined and losses:
        wait(losses[-1])
        times = [(time.perf_counter() - start) / steps] * steps
    return times, [float(l) for l in losses]


def gelu(x, tanh):
    """GELU, tanh form, in lazuli's order of operations."""
    inner = x + (x * x * x) * 0.044715
    return (x * 0.5) * (tanh(inner * math.sqrt(2.0 / math.pi)) + 1.0)


# --------------------------------------------------------------------------------------------------------- JAX
class JaxSide:
    def __init__(self, workload, tensors):
        import jax
        import jax.numpy as jnp

        if os.environ.get("LAZULI_BENCH_JAX_SYNC") == "1":
            # JAX's CPU client, like lazuli's default one, runs programs on the calling thread.
            jax.config.update("jax_cpu_enable_async_dispatch", False)
        self.jax, self.jnp = jax, jnp
        self.w = workload
        self.device = jax.devices()[0]
        self.fused = workload.get("attention") == "fused"
        # cuDNN's flash attention on a GPU; XLA's own lowering where there is none (dry runs).
        self.attention_impl = "cudnn" if self.device.platform == "gpu" else "xla"
        names = sorted(k for k in tensors if k.startswith("model."))
        self.params = {k[len("model."):]: jax.device_put(tensors[k], self.device) for k in names}
        self.xs, self.ys = tensors["extra.x"], tensors["extra.y"]
        opt = workload["optimizer"]
        self.opt = opt
        if opt["name"] == "adamw":
            zeros = lambda p: jax.device_put(np.zeros(p.shape, np.float32), self.device)
            self.state = ({k: zeros(p) for k, p in self.params.items()}, {k: zeros(p) for k, p in self.params.items()})
        else:
            self.state = ()
        self.t = 0
        self.batch = 0
        loss_fn = self.mlp_loss if workload["kind"] == "mlp" else self.gpt_loss
        grad_fn = jax.value_and_grad(loss_fn)
        f32 = jnp.float32

        if opt["name"] == "sgd":

            def step(params, state, x, y, s):
                loss, g = grad_fn(params, x, y)
                new = {k: params[k] - g[k] * s["lr"] for k in params}
                return new, state, loss

        else:
            b1, b2, eps = f32(opt["beta1"]), f32(opt["beta2"]), f32(opt["eps"])

            def step(params, state, x, y, s):
                loss, g = grad_fn(params, x, y)
                m0, v0 = state
                new, m1, v1 = {}, {}, {}
                for k in params:
                    m = m0[k] * b1 + g[k] * (f32(1.0) - b1)
                    v = v0[k] * b2 + g[k] * g[k] * (f32(1.0) - b2)
                    denom = jnp.sqrt(v) * s["inv_sqrt_bc2"] + eps
                    new[k] = params[k] * s["decay"] - m / denom * s["step_size"]
                    m1[k], v1[k] = m, v
                return new, (m1, v1), loss

        # Parameters and optimizer state are donated, as lazuli donates them: updated in place.
        self.step_fn = jax.jit(step, donate_argnums=(0, 1))
        t0 = time.perf_counter()
        self.step_fn = self.step_fn.lower(self.params, self.state, self.xs[0], self.ys[0], self.scalars(1)).compile()
        self.compile_s = time.perf_counter() - t0

        # The same call with an empty program: the same arguments and donation, results passed through. Its time
        # is JAX's dispatch alone; the step's time minus it is what the step's program takes to run.
        def empty(params, state, x, y, s):
            return params, state, jnp.zeros((), jnp.float32)

        self.empty_fn = jax.jit(empty, donate_argnums=(0, 1))
        self.empty_fn = self.empty_fn.lower(self.params, self.state, self.xs[0], self.ys[0], self.scalars(1)).compile()

    def scalars(self, t):
        np32 = np.float32
        if self.opt["name"] == "sgd":
            return {"lr": np32(self.opt["lr"])}
        return {k: np32(v) for k, v in adamw_scalars(self.opt, t).items()}

    def mm(self, a, b):
        if self.w.get("bf16_matmul"):
            bf = self.jnp.bfloat16
            return self.jnp.matmul(a.astype(bf), b.astype(bf)).astype(self.jnp.float32)
        return self.jnp.matmul(a, b)

    def cross_entropy(self, logits, y):
        jnp = self.jnp
        lsm = self.jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(lsm, y[:, None], axis=1))

    def mlp_loss(self, p, x, y):
        n = len(self.w["sizes"]) - 1
        h = x
        for i in range(n):
            h = self.mm(h, p[f"layers.{i}.weight"]) + p[f"layers.{i}.bias"]
            if i + 1 < n:
                h = self.jnp.maximum(h, 0.0)
        return self.cross_entropy(h, y)

    def layer_norm(self, x, w, b):
        c = x - x.mean(-1, keepdims=True)
        var = (c * c).mean(-1, keepdims=True)
        return c * self.jax.lax.rsqrt(var + 1e-5) * w + b

    def gpt_loss(self, p, ids, targets):
        jnp, w = self.jnp, self.w
        B, T = ids.shape
        d, H = w["d_model"], w["n_head"]
        hd = d // H
        x = p["wte.weight"][ids] + p["wpe.weight"][jnp.arange(T)]
        causal = jnp.tril(jnp.ones((T, T), bool))

        def block(x, q):
            h = self.layer_norm(x, q["ln1.weight"], q["ln1.bias"])
            qkv = (self.mm(h, q["attn.qkv.weight"]) + q["attn.qkv.bias"]).reshape(B, T, 3, H, hd)
            y = self.attend(qkv, causal).reshape(B, T, d)
            x = x + (self.mm(y, q["attn.proj.weight"]) + q["attn.proj.bias"])
            h = self.layer_norm(x, q["ln2.weight"], q["ln2.bias"])
            h = self.mm(h, q["fc.weight"]) + q["fc.bias"]
            h = gelu(h, jnp.tanh)
            return x + (self.mm(h, q["fc_proj.weight"]) + q["fc_proj.bias"])

        layers = [{k[len(f"blocks.{l}."):]: v for k, v in p.items() if k.startswith(f"blocks.{l}.")}
                  for l in range(w["n_layer"])]
        if w.get("scan_layers"):
            # One block's program run n_layer times over the weights stacked per name (as a JAX user who scans
            # over layers writes it; the stacking is part of the step here, since the weights are kept per layer).
            stacked = {k: jnp.stack([layer[k] for layer in layers]) for k in layers[0]}
            x, _ = self.jax.lax.scan(lambda x, q: (block(x, q), None), x, stacked)
        else:
            for q in layers:
                x = block(x, q)
        x = self.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
        logits = self.mm(x, p["wte.weight"].T)
        return self.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))

    def attend(self, qkv, causal):
        """Causal self-attention of qkv [B, T, 3, H, hd] -> [B, T, H, hd], f32."""
        jnp = self.jnp
        hd = qkv.shape[-1]
        if self.fused:
            # bf16 q, k, v in the projection's own [B, T, H, hd] layout (BTNH), no transposes.
            qkv = qkv.astype(jnp.bfloat16)
            y = self.jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True,
                                                  implementation=self.attention_impl)
            return y.astype(jnp.float32)
        qkv = qkv.transpose(2, 0, 3, 1, 4)
        qq, kk, vv = qkv[0], qkv[1], qkv[2]
        scores = self.mm(qq, kk.swapaxes(-1, -2)) * (1.0 / math.sqrt(hd))
        scores = jnp.where(causal, scores, -jnp.inf)
        att = self.jax.nn.softmax(scores, axis=-1)
        return self.mm(att, vv).transpose(0, 2, 1, 3)

    def attention_info(self):
        if self.fused:
            return (f'jax.nn.dot_product_attention(is_causal=True, implementation="{self.attention_impl}"), '
                    "bf16 q, k, v in [B, T, H, hd]")
        return "written out (bf16 matmuls, f32 mask and softmax)"

    def run(self, steps, pipelined=False, empty=False):
        fn = self.empty_fn if empty else self.step_fn

        def prepare():
            self.t += 1
            i = self.batch % len(self.xs)
            self.batch += 1
            return i, self.scalars(self.t)

        def launch(prepared):
            i, s = prepared
            self.params, self.state, loss = fn(self.params, self.state, self.xs[i], self.ys[i], s)
            return loss

        batch, t = self.batch, self.t
        out = timed_steps(steps, pipelined, prepare, launch, lambda loss: loss.block_until_ready())
        if empty:
            # Training resumes where it was: the empty calls do not use up batches or optimizer steps.
            self.batch, self.t = batch, t
        return out

    def profile(self, steps, out_dir):
        """`steps` more steps under jax.profiler; it writes `*.xplane.pb` under `out_dir`."""
        self.jax.profiler.start_trace(out_dir)
        try:
            self.run(steps)
        finally:
            self.jax.profiler.stop_trace()

    def peak_bytes(self):
        stats = self.device.memory_stats()  # None on the CPU
        return stats.get("peak_bytes_in_use") if stats else None

    def versions(self):
        import jaxlib

        return {"framework": "jax " + self.jax.__version__ + " (jaxlib " + jaxlib.__version__ + ")",
                "device": str(self.device.device_kind), "attention": self.attention_info()}


# ----------------------------------------------------------------------------------------------------- PyTorch
class TorchSide:
    def __init__(self, workload, tensors):
        import torch

        self.torch = torch
        self.w = workload
        self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.fused = workload.get("attention") == "fused"
        if self.fused and self.dev.type != "cuda":
            # No GPU (dry runs): SDPA's math backend. This switch is global; the CPU's flash kernel obeys it too.
            torch.backends.cuda.enable_flash_sdp(False)
        names = sorted(k for k in tensors if k.startswith("model."))
        self.params = {
            k[len("model."):]: torch.tensor(tensors[k], device=self.dev).requires_grad_(True) for k in names
        }
        self.xs = torch.tensor(tensors["extra.x"]).long() if workload["kind"] == "gpt" else torch.tensor(tensors["extra.x"])
        self.ys = torch.tensor(tensors["extra.y"]).long()
        opt = workload["optimizer"]
        plist = list(self.params.values())
        if opt["name"] == "sgd":
            self.opt = torch.optim.SGD(plist, lr=opt["lr"])
        else:
            # PyTorch's AdamW: the update lazuli's AdamW reproduces (same order, same bias correction).
            fused = self.dev.type == "cuda"
            self.opt = torch.optim.AdamW(plist, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"],
                                         weight_decay=opt["weight_decay"], fused=fused)
        loss_fn = self.mlp_loss if workload["kind"] == "mlp" else self.gpt_loss
        self.loss_fn = torch.compile(loss_fn)
        self.batch = 0
        self.compile_s = 0.0

    def mm(self, a, b):
        if self.w.get("bf16_matmul"):
            return self.torch.matmul(a.bfloat16(), b.bfloat16()).float()
        return self.torch.matmul(a, b)

    def mlp_loss(self, p, x, y):
        F = self.torch.nn.functional
        n = len(self.w["sizes"]) - 1
        h = x
        for i in range(n):
            h = self.mm(h, p[f"layers.{i}.weight"]) + p[f"layers.{i}.bias"]
            if i + 1 < n:
                h = self.torch.relu(h)
        return F.cross_entropy(h, y)

    def layer_norm(self, x, w, b):
        c = x - x.mean(-1, keepdim=True)
        var = (c * c).mean(-1, keepdim=True)
        return c * self.torch.rsqrt(var + 1e-5) * w + b

    def gpt_loss(self, p, ids, targets):
        torch, w = self.torch, self.w
        B, T = ids.shape
        d, H = w["d_model"], w["n_head"]
        hd = d // H
        x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(T, device=ids.device)]
        causal = torch.tril(torch.ones((T, T), dtype=torch.bool, device=ids.device))
        for l in range(w["n_layer"]):
            q = lambda n: p[f"blocks.{l}.{n}"]
            h = self.layer_norm(x, q("ln1.weight"), q("ln1.bias"))
            qkv = (self.mm(h, q("attn.qkv.weight")) + q("attn.qkv.bias")).reshape(B, T, 3, H, hd)
            y = self.attend(qkv.permute(2, 0, 3, 1, 4), causal).permute(0, 2, 1, 3).reshape(B, T, d)
            x = x + (self.mm(y, q("attn.proj.weight")) + q("attn.proj.bias"))
            h = self.layer_norm(x, q("ln2.weight"), q("ln2.bias"))
            h = self.mm(h, q("fc.weight")) + q("fc.bias")
            h = gelu(h, torch.tanh)
            x = x + (self.mm(h, q("fc_proj.weight")) + q("fc_proj.bias"))
        x = self.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
        logits = self.mm(x, p["wte.weight"].t())
        return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))

    def attend(self, qkv, causal):
        """Causal self-attention of qkv [3, B, H, T, hd] -> [B, H, T, hd], f32."""
        torch = self.torch
        if self.fused:
            qkv = qkv.bfloat16()
            y = torch.nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            return y.float()
        qq, kk, vv = qkv[0], qkv[1], qkv[2]
        scores = self.mm(qq, kk.transpose(-1, -2)) * (1.0 / math.sqrt(qq.shape[-1]))
        scores = scores.masked_fill(~causal, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        return self.mm(att, vv)

    def attention_info(self):
        if not self.fused:
            return "written out (bf16 matmuls, f32 mask and softmax)"
        backend = "PyTorch's choice of kernel" if self.dev.type == "cuda" else "math backend"
        return f"F.scaled_dot_product_attention(is_causal=True), bf16 q, k, v in [B, H, T, hd], {backend}"

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def run(self, steps, pipelined=False):
        def prepare():
            i = self.batch % len(self.xs)
            self.batch += 1
            return i

        def launch(i):
            x, y = self.xs[i].to(self.dev, non_blocking=True), self.ys[i].to(self.dev, non_blocking=True)
            loss = self.loss_fn(self.params, x, y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return loss.detach()

        return timed_steps(steps, pipelined, prepare, launch, lambda _: self.sync())

    def peak_bytes(self):
        return self.torch.cuda.max_memory_allocated() if self.dev.type == "cuda" else None

    def versions(self):
        dev = self.torch.cuda.get_device_name() if self.dev.type == "cuda" else "cpu"
        return {"framework": "torch " + self.torch.__version__ + " (torch.compile)", "device": dev,
                "attention": self.attention_info()}


def main():
    framework = sys.argv[1] if len(sys.argv) > 1 else "jax"
    side = None
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["cmd"] == "setup":
                tensors = load_file(msg["weights"])
                cls = JaxSide if framework == "jax" else TorchSide
                t0 = time.perf_counter()
                side = cls(msg["workload"], tensors)
                reply({"ok": True, "setup_s": time.perf_counter() - t0, "compile_s": side.compile_s,
                       "versions": side.versions(), "python": sys.version.split()[0],
                       "numpy": np.__version__})
            elif msg["cmd"] == "run":
                kw = {"empty": True} if msg.get("empty") else {}
                times, losses = side.run(int(msg["steps"]), bool(msg.get("pipelined", False)), **kw)
                reply({"ok": True, "times": times, "losses": losses, "peak_bytes": side.peak_bytes()})
            elif msg["cmd"] == "profile":
                if not hasattr(side, "profile"):
                    raise NotImplementedError(f"no profile for {framework}")
                side.profile(int(msg["steps"]), msg["dir"])
                reply({"ok": True})
            elif msg["cmd"] == "quit":
                reply({"ok": True})
                return
            else:
                reply({"ok": False, "error": f"unknown command {msg['cmd']!r}"})
        except Exception as e:  # reported to the harness, which prints it with the workload's name
            import traceback

            reply({"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    main()
