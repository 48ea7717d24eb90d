"""lazuli's flash attention, written once more in Triton-Python: the twin of the Rust TTIR generator in
`kernels/src/triton/flash.rs` (and `flash/*.rs`), step for step, so the algorithm can be checked on a CPU.

Run it with the Triton interpreter against a float64 numpy reference (no GPU, no torch needed):

    TRITON_INTERPRET=1 python kernels/python/flash_twin.py [--random N]

On a machine with a GPU, torch and Triton, `--gpu DIR` instead runs the Rust generator's own TTIR (written by
`cargo run -p lazuli-kernels --example dump_ttir -- DIR`) against the same reference, and `--bench` times it:

    python kernels/python/flash_twin.py --gpu DIR [--bench] [--only SUBSTRING]

It is not used by lazuli itself. Every shape, stride, block size and flag is a constexpr, as in the Rust
generator, where they are constants of the IR; the kernel arguments are pointers only.

The algorithm (all three kernels share it):
- a row block of queries [m0, m0 + BM) meets key blocks [n0, n0 + BN); key j is visible to query i iff
  i < seq_q, j < seq_kv, and, when causal, j <= i and (with a window) i - j < window;
- blocks that no pair sees are skipped by the loop bounds; blocks that every pair sees run without the
  elementwise mask; the rest (the diagonal, the window's edge, the ragged tails) run with it;
- scores are kept in base 2: s2 = (q . k) * scale * log2(e), so exp2 replaces exp; the stored lse is natural;
- a row that sees no key keeps m = -inf and l = 0 and gives o = 0 and zero gradients.
"""

import math
import os
import sys

import numpy as np
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


# ---------------------------------------------------------------------------------------------------------------
# Shared steps
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _rows(bh, SEQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BTHD: tl.constexpr):
    """Element offset of row 0 of head `bh` and the stride between rows, for a [.., SEQ, .., D] tensor."""
    if BTHD:
        b = bh // H
        h = bh % H
        base = b.to(tl.int64) * (SEQ * H * D) + h * D
        stride = H * D
    else:
        base = bh.to(tl.int64) * (SEQ * D)
        stride = D
    return base, stride


@triton.jit
def _tile_ptrs(ptr, base, stride, offs_row, offs_d):
    return ptr + base + offs_row[:, None] * stride + offs_d[None, :]


@triton.jit
def _tile_mask(offs_row, offs_d, SEQ: tl.constexpr, D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """In bounds: columns below the head dim, and rows below SEQ when CHECK_ROWS (blocks seen whole need not)."""
    mask = (offs_row[:, None] >= 0) & (offs_d[None, :] < D)
    if CHECK_ROWS:
        mask = mask & (offs_row[:, None] < SEQ)
    return mask


@triton.jit
def _visible(offs_m, offs_n, SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr, CAUSAL: tl.constexpr,
             WINDOW: tl.constexpr):
    vis = (offs_m[:, None] < SEQ_Q) & (offs_n[None, :] < SEQ_KV)
    if CAUSAL:
        vis = vis & (offs_n[None, :] <= offs_m[:, None])
    if WINDOW > 0:
        vis = vis & (offs_m[:, None] - offs_n[None, :] < WINDOW)
    return vis


@triton.jit
def _floor_to(x, B: tl.constexpr):
    return (x // B) * B


@triton.jit
def _ceil_to(x, B: tl.constexpr):
    return ((x + B - 1) // B) * B


@triton.jit
def _kv_ranges(m0, BM: tl.constexpr, BN: tl.constexpr, SEQ_KV: tl.constexpr, CAUSAL: tl.constexpr,
               WINDOW: tl.constexpr):
    """For the query block [m0, m0 + BM): key blocks [lo, f0) and [f1, hi) need the mask, [f0, f1) don't."""
    lo = 0
    f0 = 0
    hi = SEQ_KV
    f1 = _floor_to(SEQ_KV, BN)
    if CAUSAL:
        hi = tl.minimum(m0 + BM, SEQ_KV)
        f1 = _floor_to(tl.minimum(m0 + 1, SEQ_KV), BN)
    if WINDOW > 0:
        lo = _floor_to(tl.maximum(m0 - WINDOW + 1, 0), BN)
        f0 = _ceil_to(tl.maximum(m0 + BM - WINDOW, 0), BN)
    f0 = tl.minimum(tl.maximum(f0, lo), hi)
    f1 = tl.minimum(tl.maximum(f1, f0), hi)
    return lo, f0, f1, hi


@triton.jit
def _q_ranges(n0, BM: tl.constexpr, BN: tl.constexpr, SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """For the key block [n0, n0 + BN): query blocks [lo, f0) and [f1, hi) need the mask, [f0, f1) don't."""
    lo = 0
    f0 = 0
    hi = SEQ_Q
    last = SEQ_Q
    if CAUSAL:
        lo = _floor_to(n0, BM)
        f0 = _ceil_to(n0 + BN - 1, BM)
    if WINDOW > 0:
        hi = tl.minimum(n0 + BN - 1 + WINDOW, SEQ_Q)
        last = tl.minimum(n0 + WINDOW, SEQ_Q)
    f1 = _floor_to(last, BM)
    # A ragged last key block is never whole.
    if n0 + BN > SEQ_KV:
        f1 = 0
    f0 = tl.minimum(tl.maximum(f0, lo), hi)
    f1 = tl.minimum(tl.maximum(f1, f0), hi)
    return lo, f0, f1, hi


# ---------------------------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2: tl.constexpr,
               MASKED: tl.constexpr, SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr, D: tl.constexpr,
               BN: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, PREC: tl.constexpr):
    offs_n = n0 + tl.arange(0, BN)
    ld_mask = _tile_mask(offs_n, offs_d, SEQ_KV, D, MASKED)
    k = tl.load(_tile_ptrs(k_ptr, kv_base, kv_stride, offs_n, offs_d), mask=ld_mask, other=0.0)
    v = tl.load(_tile_ptrs(v_ptr, kv_base, kv_stride, offs_n, offs_d), mask=ld_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * QK2
    if MASKED:
        s = tl.where(_visible(offs_m, offs_n, SEQ_Q, SEQ_KV, CAUSAL, WINDOW), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # A row that has seen nothing yet keeps m = -inf; subtract 0 instead so that exp2 gives 0, not NaN.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_sub = m_new
    p = tl.math.exp2(s - m_sub[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
    return acc, l_i, m_new


@triton.jit
def flash_fwd(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, H: tl.constexpr, SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr,
              D: tl.constexpr, BTHD: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
              QK2: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    m0 = pid_m * BM
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    q_base, q_stride = _rows(bh, SEQ_Q, H, D, BTHD)
    kv_base, kv_stride = _rows(bh, SEQ_KV, H, D, BTHD)
    q_mask = (offs_m[:, None] < SEQ_Q) & (offs_d[None, :] < D)
    q = tl.load(_tile_ptrs(q_ptr, q_base, q_stride, offs_m, offs_d), mask=q_mask, other=0.0)

    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    lo, f0, f1, hi = _kv_ranges(m0, BM, BN, SEQ_KV, CAUSAL, WINDOW)
    for n0 in range(lo, f0, BN):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2,
                                   True, SEQ_Q, SEQ_KV, D, BN, CAUSAL, WINDOW, PREC)
    for n0 in range(f0, f1, BN):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2,
                                   False, SEQ_Q, SEQ_KV, D, BN, CAUSAL, WINDOW, PREC)
    for n0 in range(f1, hi, BN):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2,
                                   True, SEQ_Q, SEQ_KV, D, BN, CAUSAL, WINDOW, PREC)

    # A row that saw no key has l = 0: divide by 1 instead (acc is 0 there) and report lse = -inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    tl.store(_tile_ptrs(o_ptr, q_base, q_stride, offs_m, offs_d), o.to(o_ptr.dtype.element_ty), mask=q_mask)
    tl.store(lse_ptr + bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=offs_m < SEQ_Q)


# ---------------------------------------------------------------------------------------------------------------
# Backward: dq
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _dq_block(dq, q, do, lse2, delta, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2: tl.constexpr,
              MASKED: tl.constexpr, SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr, D: tl.constexpr,
              BN: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, PREC: tl.constexpr):
    offs_n = n0 + tl.arange(0, BN)
    ld_mask = _tile_mask(offs_n, offs_d, SEQ_KV, D, MASKED)
    k = tl.load(_tile_ptrs(k_ptr, kv_base, kv_stride, offs_n, offs_d), mask=ld_mask, other=0.0)
    v = tl.load(_tile_ptrs(v_ptr, kv_base, kv_stride, offs_n, offs_d), mask=ld_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * QK2
    p = tl.math.exp2(s - lse2[:, None])
    if MASKED:
        p = tl.where(_visible(offs_m, offs_n, SEQ_Q, SEQ_KV, CAUSAL, WINDOW), p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PREC)
    return dq


@triton.jit
def flash_bwd_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, H: tl.constexpr, SEQ_Q: tl.constexpr,
                 SEQ_KV: tl.constexpr, D: tl.constexpr, BTHD: tl.constexpr, CAUSAL: tl.constexpr,
                 WINDOW: tl.constexpr, SCALE: tl.constexpr, QK2: tl.constexpr, PREC: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    m0 = pid_m * BM
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    q_base, q_stride = _rows(bh, SEQ_Q, H, D, BTHD)
    kv_base, kv_stride = _rows(bh, SEQ_KV, H, D, BTHD)
    q_mask = (offs_m[:, None] < SEQ_Q) & (offs_d[None, :] < D)
    q = tl.load(_tile_ptrs(q_ptr, q_base, q_stride, offs_m, offs_d), mask=q_mask, other=0.0)
    do = tl.load(_tile_ptrs(do_ptr, q_base, q_stride, offs_m, offs_d), mask=q_mask, other=0.0)
    row = bh.to(tl.int64) * SEQ_Q + offs_m
    lse2 = tl.load(lse_ptr + row, mask=offs_m < SEQ_Q, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + row, mask=offs_m < SEQ_Q, other=0.0)

    dq = tl.zeros([BM, BD], tl.float32)
    lo, f0, f1, hi = _kv_ranges(m0, BM, BN, SEQ_KV, CAUSAL, WINDOW)
    for n0 in range(lo, f0, BN):
        dq = _dq_block(dq, q, do, lse2, delta, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2, True,
                       SEQ_Q, SEQ_KV, D, BN, CAUSAL, WINDOW, PREC)
    for n0 in range(f0, f1, BN):
        dq = _dq_block(dq, q, do, lse2, delta, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2, False,
                       SEQ_Q, SEQ_KV, D, BN, CAUSAL, WINDOW, PREC)
    for n0 in range(f1, hi, BN):
        dq = _dq_block(dq, q, do, lse2, delta, k_ptr, v_ptr, kv_base, kv_stride, offs_m, offs_d, n0, QK2, True,
                       SEQ_Q, SEQ_KV, D, BN, CAUSAL, WINDOW, PREC)
    dq = dq * SCALE
    tl.store(_tile_ptrs(dq_ptr, q_base, q_stride, offs_m, offs_d), dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


# ---------------------------------------------------------------------------------------------------------------
# Backward: dk, dv
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_block(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, q_stride, bh, offs_n, offs_d, m0,
                QK2: tl.constexpr, MASKED: tl.constexpr, SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr,
                D: tl.constexpr, BM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                PREC: tl.constexpr):
    offs_m = m0 + tl.arange(0, BM)
    ld_mask = _tile_mask(offs_m, offs_d, SEQ_Q, D, MASKED)
    q = tl.load(_tile_ptrs(q_ptr, q_base, q_stride, offs_m, offs_d), mask=ld_mask, other=0.0)
    do = tl.load(_tile_ptrs(do_ptr, q_base, q_stride, offs_m, offs_d), mask=ld_mask, other=0.0)
    row = bh.to(tl.int64) * SEQ_Q + offs_m
    row_mask = (offs_m < SEQ_Q) | (not MASKED)
    lse2 = tl.load(lse_ptr + row, mask=row_mask, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + row, mask=row_mask, other=0.0)
    # Transposed scores, [BN, BM]: the key block is the row block here.
    st = tl.dot(k, tl.trans(q), input_precision=PREC) * QK2
    pt = tl.math.exp2(st - lse2[None, :])
    if MASKED:
        pt = tl.where(_visible(offs_m, offs_n, SEQ_Q, SEQ_KV, CAUSAL, WINDOW).T, pt, 0.0)
    dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PREC)
    dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
    dst = pt * (dpt - delta[None, :])
    dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=PREC)
    return dk, dv


@triton.jit
def flash_bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, H: tl.constexpr,
                   SEQ_Q: tl.constexpr, SEQ_KV: tl.constexpr, D: tl.constexpr, BTHD: tl.constexpr,
                   CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SCALE: tl.constexpr, QK2: tl.constexpr,
                   PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    q_base, q_stride = _rows(bh, SEQ_Q, H, D, BTHD)
    kv_base, kv_stride = _rows(bh, SEQ_KV, H, D, BTHD)
    kv_mask = (offs_n[:, None] < SEQ_KV) & (offs_d[None, :] < D)
    k = tl.load(_tile_ptrs(k_ptr, kv_base, kv_stride, offs_n, offs_d), mask=kv_mask, other=0.0)
    v = tl.load(_tile_ptrs(v_ptr, kv_base, kv_stride, offs_n, offs_d), mask=kv_mask, other=0.0)

    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    lo, f0, f1, hi = _q_ranges(n0, BM, BN, SEQ_Q, SEQ_KV, CAUSAL, WINDOW)
    for m0 in range(lo, f0, BM):
        dk, dv = _dkdv_block(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, q_stride, bh, offs_n,
                             offs_d, m0, QK2, True, SEQ_Q, SEQ_KV, D, BM, CAUSAL, WINDOW, PREC)
    for m0 in range(f0, f1, BM):
        dk, dv = _dkdv_block(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, q_stride, bh, offs_n,
                             offs_d, m0, QK2, False, SEQ_Q, SEQ_KV, D, BM, CAUSAL, WINDOW, PREC)
    for m0 in range(f1, hi, BM):
        dk, dv = _dkdv_block(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, q_stride, bh, offs_n,
                             offs_d, m0, QK2, True, SEQ_Q, SEQ_KV, D, BM, CAUSAL, WINDOW, PREC)
    dk = dk * SCALE
    tl.store(_tile_ptrs(dk_ptr, kv_base, kv_stride, offs_n, offs_d), dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(_tile_ptrs(dv_ptr, kv_base, kv_stride, offs_n, offs_d), dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


# ---------------------------------------------------------------------------------------------------------------
# Reference and checks
# ---------------------------------------------------------------------------------------------------------------


class NpTensor:
    """A numpy array that the Triton interpreter takes as a kernel's pointer argument (it expects torch's tensor
    methods; this is the few it calls), so the twin needs no torch."""

    def __init__(self, array, dtype=None):
        self.a = array
        self.dtype = dtype or {np.float32: tl.float32, np.float64: tl.float64}[array.dtype.type]

    def data_ptr(self):
        return self.a.ctypes.data

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *_args, **_kwargs):
        return NpTensor(self.a, self.dtype)

    def storage_offset(self):
        return 0

    def size(self):
        return self.a.shape

    def stride(self):
        return self.a.strides

    def set_(self, storage, *_args):
        self.a = storage.a
        return self

    def copy_(self, other):
        if other.a is not self.a:
            self.a[...] = other.a


def visible_np(tq, tk, causal, window):
    i = np.arange(tq)[:, None]
    j = np.arange(tk)[None, :]
    vis = np.ones((tq, tk), bool)
    if causal:
        vis &= j <= i
    if window:
        vis &= i - j < window
    return vis


def reference(q, k, v, do, scale, causal, window):
    """float64 attention over [B, H, T, D] arrays: o, lse (natural), dq, dk, dv; empty rows give 0 (lse -inf)."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    vis = visible_np(q.shape[2], k.shape[2], causal, window)
    s = np.where(vis, scale * q @ k.swapaxes(-1, -2), -np.inf)
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    l = e.sum(-1, keepdims=True)
    p = e / np.where(l == 0, 1.0, l)
    with np.errstate(divide="ignore"):
        lse = np.where(l == 0, -np.inf, m_safe + np.log(l))[..., 0]
    o = p @ v
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    delta = (do * o).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    dq = scale * ds @ k
    dk = scale * ds.swapaxes(-1, -2) @ q
    return o, lse, dq, dk, dv


def next_pow2_16(d):
    return max(16, 1 << (d - 1).bit_length())


def errors(got, ref):
    """Max abs error per result (lse: where finite; -inf must match); NaN where a result is not finite or
    where -inf rows differ."""
    errs = {}
    for name, g, r in zip(["o", "lse", "dq", "dk", "dv"], got, ref):
        g = np.asarray(g, np.float64)
        if (name != "lse" and not np.isfinite(g).all()) or not ((g == r) | (np.isfinite(g) & np.isfinite(r))).all():
            errs[name] = float("nan")
            continue
        fin = np.isfinite(r)
        errs[name] = float(np.max(np.abs(g[fin] - r[fin]), initial=0.0))
    return errs


def to_layout(x, bthd):
    """[B, H, T, D] -> the kernel's layout, contiguous."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3) if bthd else x)


def from_layout(x, bthd):
    return x.transpose(0, 2, 1, 3) if bthd else x


def run_case(b, h, tq, tk, d, causal, window, bthd, blocks, seed=0):
    """The twin's three kernels on random f32 inputs (ieee products) against the float64 reference."""
    rng = np.random.default_rng(seed)
    shape_q, shape_k = (b, h, tq, d), (b, h, tk, d)
    q, do = rng.standard_normal(shape_q).astype(np.float32), rng.standard_normal(shape_q).astype(np.float32)
    k, v = rng.standard_normal(shape_k).astype(np.float32), rng.standard_normal(shape_k).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    ref = reference(q, k, v, do, scale, causal, window)

    qt, kt, vt, dot_ = (to_layout(x, bthd) for x in (q, k, v, do))
    o = np.zeros_like(qt)
    lse = np.zeros((b, h, tq), np.float32)
    common = dict(H=h, SEQ_Q=tq, SEQ_KV=tk, D=d, BTHD=bthd, CAUSAL=causal, WINDOW=window or 0,
                  QK2=scale * LOG2E.value, PREC="ieee", BD=next_pow2_16(d))
    P = NpTensor
    (fm, fn), (qm, qn), (km, kn) = blocks["fwd"], blocks["dq"], blocks["dkdv"]
    flash_fwd[(triton.cdiv(tq, fm), b * h, 1)](P(qt), P(kt), P(vt), P(o), P(lse), BM=fm, BN=fn, **common)
    # The caller's delta: rowsum(do * o) in f32, from the kernel's own o, as [B, H, Tq].
    delta = np.ascontiguousarray(from_layout(dot_ * o, bthd).sum(-1, dtype=np.float32))
    dq, dk, dv = np.zeros_like(qt), np.zeros_like(kt), np.zeros_like(vt)
    flash_bwd_dq[(triton.cdiv(tq, qm), b * h, 1)](P(qt), P(kt), P(vt), P(dot_), P(lse), P(delta), P(dq),
                                                  SCALE=scale, BM=qm, BN=qn, **common)
    flash_bwd_dkdv[(triton.cdiv(tk, kn), b * h, 1)](P(qt), P(kt), P(vt), P(dot_), P(lse), P(delta), P(dk), P(dv),
                                                    SCALE=scale, BM=km, BN=kn, **common)
    got = [from_layout(o, bthd), lse, from_layout(dq, bthd), from_layout(dk, bthd), from_layout(dv, bthd)]
    return errors(got, ref)


CASES = [
    # b, h, tq, tk, d, causal, window, bthd
    (1, 2, 100, 100, 64, False, None, False),
    (1, 2, 100, 100, 64, True, None, False),
    (2, 1, 77, 130, 128, False, None, True),
    (1, 2, 77, 130, 32, True, None, True),
    (1, 1, 130, 77, 80, True, None, False),
    (1, 2, 128, 128, 80, True, 40, True),
    (1, 1, 200, 150, 48, True, 33, False),
    (1, 1, 300, 50, 64, True, 20, False),  # rows 70.. see no key: o = 0, grads 0
    (1, 1, 96, 96, 96, True, 256, True),
    (1, 1, 64, 64, 16, False, None, False),
    (1, 1, 256, 256, 64, True, 100, False),
    (1, 1, 512, 512, 32, True, 200, True),  # whole blocks inside the window
    (1, 1, 640, 640, 64, True, None, False),
]

# (block_m, block_n) per kernel: lazuli's choice for head dims up to 64, and smaller mixed ones that give
# many blocks, diagonals that cross several, and block_m != block_n both ways.
BLOCK_SETS = {
    "lazuli": {"fwd": (128, 64), "dq": (64, 64), "dkdv": (64, 64)},
    "mixed": {"fwd": (32, 16), "dq": (16, 32), "dkdv": (64, 16)},
}


def random_cases(n, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        causal = bool(rng.integers(3))
        window = int(rng.integers(1, 200)) if causal and rng.integers(2) else None
        yield (1, int(rng.integers(1, 3)), int(rng.integers(1, 260)), int(rng.integers(1, 260)),
               8 * int(rng.integers(1, 17)), causal, window, bool(rng.integers(2)))


# ---------------------------------------------------------------------------------------------------------------
# The Rust generator's TTIR on a GPU (`gpu DIR`): compiled with Triton, run with torch, checked against the same
# float64 reference, optionally timed. DIR is what `cargo run -p lazuli-kernels --example dump_ttir -- DIR` wrote.
# ---------------------------------------------------------------------------------------------------------------

# Largest error allowed, relative to the largest magnitude of the reference result.
TOLERANCE = {"bf16": 3e-2, "f16": 5e-3, "f32tf32": 5e-3, "f32ieee": 1e-4}


def _compile(path, opts):
    from triton.backends.compiler import GPUTarget

    return triton.compile(str(path), target=GPUTarget("cuda", 90, 32), options=opts)


def _precompile(job):
    path, opts = job
    try:
        _compile(path, opts)
        return None
    except Exception as e:
        return f"{path}: {str(e).strip().splitlines()[:3]}"


def load_groups(directory):
    """{stem: {kernel: (ttir path, metadata)}} from DIR/<stem>.<kernel>.json."""
    import json
    from pathlib import Path

    groups = {}
    for meta_path in sorted(Path(directory).glob("*.json")):
        meta = json.loads(meta_path.read_text())
        stem, kernel = meta_path.name[: -len(".json")].rsplit(".", 1)
        groups.setdefault(stem, {})[kernel] = (meta_path.with_suffix(".ttir"), meta)
    return groups


def gpu_case(group, bench):
    import torch

    spec = next(iter(group.values()))[1]["spec"]
    b, h, tq, tk, d = (spec[k] for k in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
    bthd = spec["layout"] == "bthd"
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[spec["dtype"]]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = lambda t: (b, t, h, d) if bthd else (b, h, t, d)
    q, do = (torch.randn(shape(tq), generator=gen, device="cuda").to(dtype) for _ in range(2))
    k, v = (torch.randn(shape(tk), generator=gen, device="cuda").to(dtype) for _ in range(2))
    kernels = {name: (_compile(path, {"num_warps": m["num_warps"], "num_stages": m["num_stages"]}), m["grid"])
               for name, (path, m) in group.items()}

    def launch(name, *args):
        kernel, grid = kernels[name]
        kernel[tuple(grid)](*args)

    o, lse = torch.empty_like(q), torch.empty((b, h, tq), device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def delta_of(o):  # the caller's rowsum(do * o) in f32, as [B, H, Tq]
        r = (do.float() * o.float()).sum(-1)
        return (r.transpose(1, 2) if bthd else r).contiguous()

    def step():
        launch("fwd", q, k, v, o, lse)
        delta = delta_of(o)
        launch("dq", q, k, v, do, lse, delta, dq)
        launch("dkdv", q, k, v, do, lse, delta, dk, dv)

    step()
    torch.cuda.synchronize()
    finite = all(bool(torch.isfinite(x).all()) for x in (o, dq, dk, dv))

    # The reference on batch 0 and up to two heads, in [B, H, T, D].
    heads = min(h, 2)
    to_bhtd = lambda x: (x.transpose(1, 2) if bthd else x)[:1, :heads].double().cpu().numpy()
    ref = reference(*(to_bhtd(x) for x in (q, k, v, do)), spec["scale"], spec["causal"], spec["window"])
    got = [to_bhtd(x) for x in (o,)] + [lse[:1, :heads].double().cpu().numpy()] + [to_bhtd(x) for x in (dq, dk, dv)]
    abs_errs = errors(got, ref)
    rel = {name: e / max(float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)), 1e-6)
           for (name, e), r in zip(abs_errs.items(), ref)}
    key = spec["dtype"] + ("" if spec["dtype"] != "f32" else ("tf32" if spec["tf32"] else "ieee"))
    ok = finite and all(e <= TOLERANCE[key] for e in rel.values())

    times = {}
    if bench:
        from triton.testing import do_bench

        times["fwd"] = do_bench(lambda: launch("fwd", q, k, v, o, lse))
        delta = delta_of(o)
        times["dq"] = do_bench(lambda: launch("dq", q, k, v, do, lse, delta, dq))
        times["dkdv"] = do_bench(lambda: launch("dkdv", q, k, v, do, lse, delta, dk, dv))
        times["delta"] = do_bench(lambda: delta_of(o))
        times["fwd+bwd"] = do_bench(step)
        times["kernels"] = times["fwd"] + times["dq"] + times["dkdv"]
    return ok, finite, rel, times


def sdpa_times(b, h, t, d, causal):
    """torch's scaled_dot_product_attention (bf16, [B, H, T, D]) forward and forward + backward, for scale."""
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    fwd = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    both = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do))
    return {"fwd": fwd, "fwd+bwd": both}


def gpu(directory, bench, jobs, only):
    groups = {stem: g for stem, g in load_groups(directory).items() if only in stem}
    # Compile everything first, in parallel (Triton caches the results), before CUDA starts in this process.
    from concurrent.futures import ProcessPoolExecutor

    jobs_list = [(path, {"num_warps": m["num_warps"], "num_stages": m["num_stages"]})
                 for g in groups.values() for path, m in g.values()]
    with ProcessPoolExecutor(jobs) as pool:
        failures = [f for f in pool.map(_precompile, jobs_list) if f]
    for f in failures:
        print("COMPILE ERROR", f)
    print(f"compiled {len(jobs_list) - len(failures)} of {len(jobs_list)} kernels", flush=True)

    passed = failed = 0
    all_groups = load_groups(directory)
    for stem, group in groups.items():
        if stem.startswith("tune_"):
            # A variant of one kernel: the others from its spec's own files.
            group = {**all_groups.get(stem.split("_", 2)[2], {}), **group}
        if set(group) != {"fwd", "dq", "dkdv"}:
            print("SKIP", stem, "(needs fwd, dq and dkdv files)")
            continue
        try:
            ok, finite, rel, times = gpu_case(group, bench and (stem.startswith("tune_") or "b8h12q1024" in stem))
        except Exception as e:
            ok, finite, rel, times = False, False, {"error": str(e).strip().splitlines()[:3]}, {}
        passed, failed = passed + ok, failed + (not ok)
        errs = " ".join(f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in rel.items())
        timing = " ".join(f"{k}={v * 1000:.1f}us" for k, v in times.items())
        print(f"{'OK  ' if ok else 'FAIL'} {stem} {errs}{'' if finite else ' NOT-FINITE'} {timing}", flush=True)
    if bench:
        for causal in (True, False):
            times = sdpa_times(8, 12, 1024, 64, causal)
            print(f"torch sdpa bf16 8x12x1024x64 causal={causal}: "
                  + " ".join(f"{k}={v * 1000:.1f}us" for k, v in times.items()), flush=True)
    print(f"{passed} passed, {failed} failed")
    return failed == 0


def patch_interpreter_index():
    """Triton 3.6's interpreter turns a one-element array into a loop bound with int(), which numpy >= 2.3
    refuses for arrays of rank 1; take the element instead."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def interpret(n_random):
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1 (the Triton interpreter, on the CPU)")
    patch_interpreter_index()
    worst = 0.0
    cases = [(c, name) for c in CASES for name in BLOCK_SETS] + [(c, "mixed") for c in random_cases(n_random)]
    for case, block_set in cases:
        errs = run_case(*case, blocks=BLOCK_SETS[block_set])
        worst = max(worst, *errs.values()) if all(np.isfinite(list(errs.values()))) else float("inf")
        print(block_set, case, " ".join(f"{k}={v:.2e}" for k, v in errs.items()), flush=True)
    ok = worst < 1e-4
    print("max abs error", worst, "OK" if ok else "FAIL")
    return ok


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random", type=int, default=12, help="random shapes to add to the fixed cases")
    parser.add_argument("--gpu", metavar="DIR", help="instead, run the generated TTIR in DIR on a GPU")
    parser.add_argument("--bench", action="store_true", help="with --gpu: time the GPT-2 shape and tune_ variants")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="with --gpu: parallel compiles")
    parser.add_argument("--only", default="", help="with --gpu: only specs whose file name contains this")
    args = parser.parse_args()
    if args.gpu:
        sys.exit(0 if gpu(args.gpu, args.bench, args.jobs, args.only) else 1)
    sys.exit(0 if interpret(args.random) else 1)


if __name__ == "__main__":
    main()
