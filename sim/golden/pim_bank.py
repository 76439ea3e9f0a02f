"""Golden model of the DIMM-PIM bank PU (``hdl/pim/bank_pu.py``), in the order of operations of ``docs/pim.md``.

All inputs and outputs are raw FP16 bit patterns (uint16). Leading axes broadcast, so one call covers many bank
PUs, tokens or heads at once:

* :func:`score_tree`   ``(q[..., N], k[..., N]) -> [...]``: ``add16`` pairwise tree over ``mul16(q_j, k_j)``.
* :func:`score_partial` ``(q[..., bursts, N], k[..., bursts, N]) -> [...]``: ``acc = +0; acc = add16(acc,
  tree_k)`` over the bursts in order.
* :func:`context_acc`  ``(p[..., tokens], v[..., tokens, N]) -> [..., N]``: ``acc_j = +0; acc_j = add16(acc_j,
  mul16(p_t, v_tj))`` over the tokens in order; with ``acc="fp32"`` (``PIMConfig.context_acc``): ``acc_j = +0;
  acc_j = add32(acc_j, mul_wide(p_t, v_tj))`` (the exact product in binary32) and the result ``f16(acc_j)``
  (FPConvert, round to nearest even) once at the end.
* :func:`run_items` : the item stream of the RTL (mode / first / last per item) -> the ``o`` words.
"""

import numpy as np

from hdl.fp.format import FP16
from .bits import as_bits
from . import fp16, fp32

__all__ = ["score_tree", "score_partial", "context_acc", "run_items", "MODE_SCORE", "MODE_CONTEXT"]

MODE_SCORE = 0      # hdl.pim.bank_pu.MODE_SCORE
MODE_CONTEXT = 1    # hdl.pim.bank_pu.MODE_CONTEXT
POS_ZERO = np.uint16(0)


def _tree(x: np.ndarray) -> np.ndarray:
    """Balanced add16 tree over the last axis (a power of two), pairs (0, 1), (2, 3), ... in index order."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"tree width must be a power of two, got {n}")
    while x.shape[-1] > 1:
        x = fp16.add(x[..., 0::2], x[..., 1::2])
    return x[..., 0]


def score_tree(q, k) -> np.ndarray:
    """One burst: ``tree = add16(add16(mul16(q0, k0), mul16(q1, k1)), add16(mul16(q2, k2), mul16(q3, k3)))``."""
    q = as_bits(q, FP16, "q")
    k = as_bits(k, FP16, "k")
    return _tree(fp16.mul(q, k))


def score_partial(q, k) -> np.ndarray:
    """``q``, ``k``: uint16 ``[..., bursts, N]`` -> uint16 ``[...]``, the bank PU's score partial."""
    trees = score_tree(q, k)                        # [..., bursts]
    acc = np.zeros(trees.shape[:-1], np.uint16)     # +0
    for b in range(trees.shape[-1]):
        acc = fp16.add(acc, trees[..., b])
    return acc


def context_acc(p, v, *, acc: str = "fp16") -> np.ndarray:
    """``p``: uint16 ``[..., tokens]``, ``v``: uint16 ``[..., tokens, N]`` -> uint16 ``[..., N]``."""
    p = as_bits(p, FP16, "p")
    v = as_bits(v, FP16, "v")
    if acc == "fp32":
        prod = fp16.mul_wide(p[..., None], v)        # [..., tokens, N] uint32, exact
        a = np.zeros(prod.shape[:-2] + prod.shape[-1:], np.uint32)
        for t in range(prod.shape[-2]):
            a = fp32.add(a, prod[..., t, :])
        return fp16.from_f32(a)
    if acc != "fp16":
        raise ValueError(f"acc must be 'fp16' or 'fp32', got {acc!r}")
    prod = fp16.mul(p[..., None], v)                # [..., tokens, N]
    out = np.zeros(prod.shape[:-2] + prod.shape[-1:], np.uint16)
    for t in range(prod.shape[-2]):
        out = fp16.add(out, prod[..., t, :])
    return out


def run_items(row, bcast, sel, mode, first, last, *, acc: str = "fp16") -> list:
    """The bank PU's ``o`` stream for a sequence of ``i`` items, element by element as the RTL does it
    (``acc``: the context accumulator format, ``PIMConfig.context_acc``).

    ``row``, ``bcast``: uint16 ``[items, N]``; ``sel``, ``mode``, ``first``, ``last``: ``[items]`` ints.
    Returns a list of ``(data, mode)`` per ``last`` item: ``data`` = the score partial (an int < 2**16) or the
    context accumulators packed from the LSB (element ``j`` in bits ``[16 j, 16 j + 16)``).
    """
    row = as_bits(row, FP16, "row")
    bcast = as_bits(bcast, FP16, "bcast")
    n = row.shape[-1]
    if acc not in ("fp16", "fp32"):
        raise ValueError(f"acc must be 'fp16' or 'fp32', got {acc!r}")
    acc_s = POS_ZERO
    acc_c = np.zeros(n, np.uint32 if acc == "fp32" else np.uint16)
    out = []
    for i in range(row.shape[0]):
        if mode[i] == MODE_SCORE:
            tree = score_tree(bcast[i], row[i])
            acc_s = fp16.add(POS_ZERO if first[i] else acc_s, tree)
            if last[i]:
                out.append((int(acc_s), MODE_SCORE))
        elif acc == "fp32":
            prod = fp16.mul_wide(bcast[i, sel[i]], row[i])
            acc_c = fp32.add(np.zeros(n, np.uint32) if first[i] else acc_c, prod)
            if last[i]:
                res = fp16.from_f32(acc_c)
                out.append((sum(int(x) << (16 * j) for j, x in enumerate(res)), MODE_CONTEXT))
        else:
            prod = fp16.mul(bcast[i, sel[i]], row[i])
            acc_c = fp16.add(np.zeros(n, np.uint16) if first[i] else acc_c, prod)
            if last[i]:
                out.append((sum(int(x) << (16 * j) for j, x in enumerate(acc_c)), MODE_CONTEXT))
    return out
