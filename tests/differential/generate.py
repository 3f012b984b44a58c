#!/usr/bin/env python3
"""Writes the differential test cases: seeded random op programs run through PyTorch.

Each case is a short program over named tensors (inputs, then steps that apply one op each),
PyTorch's result for it (dtype, shape and values, or the fact that it raises), and, where
the result is floating and an input requires grad, PyTorch's gradients for a given upstream
gradient. Values are computed twice: with the inputs in their own dtypes (for the result's
dtype, shape, integer values and errors) and with every floating dtype replaced by float64
(for the floating values and gradients). tests/conformance/test_differential.cpp replays every case on
every device; CI needs no Python.

    python3 tests/differential/generate.py [--out tests/data/differential/cases.jsonl.gz]

The seed and the number of cases per family are in the file's first line; rerunning with
them writes the same programs. Cases where normcore differs from PyTorch on purpose carry a
"differs" note and are checked against normcore's documented behaviour (docs/ERRORS.md).
"""
import argparse
import gzip
import json
import math
import random
import sys

import torch

SEED = 20261125
COUNTS = {
    "broadcast": 700,
    "scalar": 500,
    "unary": 600,
    "reduce": 600,
    "views": 400,
    "matmul": 250,
    "indexing": 450,
    "losses": 300,
    "norms": 300,
    "promotion": 300,
    "autograd": 300,
    "edges": 500,
    "rounding": 200,
}

FLOAT = ["f32", "f64"]
INT = ["i32", "i64", "u8"]
ALL = FLOAT + INT + ["bool"]
TORCH = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
         "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}
NAME = {v: k for k, v in TORCH.items()}


def is_float(dtype):
    return dtype in ("f32", "f64", "f16", "bf16")


# ---------------------------------------------------------------- values
def random_shape(rng, max_dims=3, max_size=4, allow_empty=False):
    dims = rng.randint(0, max_dims)
    lo = 0 if allow_empty and rng.random() < 0.1 else 1
    return [rng.randint(lo, max_size) for _ in range(dims)]


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def random_values(rng, dtype, n, special=False, lo=-3.0, hi=3.0):
    if dtype == "bool":
        return [rng.random() < 0.5 for _ in range(n)]
    if dtype == "u8":
        return [rng.randint(0, 255 if special else 20) for _ in range(n)]
    if dtype in INT:
        return [rng.randint(-20, 20) for _ in range(n)]
    out = []
    for _ in range(n):
        r = rng.random()
        if special and r < 0.08:
            out.append(rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0]))
        elif r < 0.15:
            out.append(float(rng.randint(-3, 3)))  # exact values make ties and zeros
        else:
            out.append(round(rng.uniform(lo, hi), 3))
    return out


def tensor_input(rng, name, dtype, shape, requires_grad=None, special=False, lo=-3.0, hi=3.0, values=None):
    if values is None:
        values = random_values(rng, dtype, numel(shape), special, lo, hi)
    if requires_grad is None:
        requires_grad = is_float(dtype) and rng.random() < 0.8
    return {"name": name, "dtype": dtype, "shape": shape, "values": values, "requires_grad": bool(requires_grad)}


def broadcastable(rng, shape):
    """A shape that broadcasts with shape (sometimes one that does not)."""
    out = []
    for s in shape[rng.randint(0, len(shape)):] if shape else []:
        out.append(rng.choice([s, 1]) if s != 1 else rng.choice([1, rng.randint(1, 3)]))
    if rng.random() < 0.05 and out:
        out[0] = out[0] + 2  # incompatible unless 1
    return out


# ---------------------------------------------------------------- programs
def step(op, out, args, **attrs):
    return {"op": op, "out": out, "args": args, "attrs": attrs}


def encode_all(v):
    """JSON has no NaN or infinity: they are written as the strings "nan", "inf", "-inf"."""
    if isinstance(v, dict):
        return {k: encode_all(x) for k, x in v.items()}
    if isinstance(v, list):
        return [encode_all(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return encode(v)
    return v


def gen_broadcast(rng):
    op = rng.choice(["add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge"])
    shape = random_shape(rng, allow_empty=True)
    da, db = rng.choice(ALL), rng.choice(ALL)
    if rng.random() < 0.5:
        db = da
    a = tensor_input(rng, "a", da, shape, special=rng.random() < 0.2)
    b = tensor_input(rng, "b", db, broadcastable(rng, shape), special=rng.random() < 0.2)
    if op == "pow":
        for t in (a, b):
            if t["dtype"] in INT:
                t["values"] = [abs(v) % 4 for v in t["values"]]
    steps = [step(op, "y", ["a", "b"])]
    if rng.random() < 0.3:
        steps.append(step("sum", "z", ["y"], dims=[], keepdim=False))
    return [a, b], steps


SCALARS = [0, 1, 2, -1, 3, 255, 256, -300, 2 ** 33, 0.5, -2.5, 1e-3, True, False, math.inf]


def gen_scalar(rng):
    op = rng.choice(["add", "sub", "mul", "div", "eq", "lt", "gt", "maximum", "minimum"])
    dtype = rng.choice(ALL)
    x = tensor_input(rng, "x", dtype, random_shape(rng), special=rng.random() < 0.2)
    scalar = rng.choice(SCALARS)
    reverse = op in ("add", "sub", "mul", "div") and rng.random() < 0.4
    return [x], [step(op + ("_rscalar" if reverse else "_scalar"), "y", ["x"], scalar=scalar)]


UNARY = ["neg", "abs", "sign", "relu", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "gelu",
         "gelu_tanh", "clamp", "pow_scalar"]


def gen_unary(rng):
    op = rng.choice(UNARY)
    dtype = rng.choice(FLOAT + ["f32", "i32", "i64"] if op in ("neg", "abs", "sign", "relu", "clamp") else FLOAT + ["f32"])
    special = rng.random() < 0.4
    lo, hi = (0.1, 4.0) if op in ("log", "sqrt", "rsqrt") and not special else (-3.0, 3.0)
    x = tensor_input(rng, "x", dtype, random_shape(rng, allow_empty=True), special=special, lo=lo, hi=hi)
    attrs = {}
    if op == "clamp":
        lo_b = rng.choice([None, -1.0, 0.0, -2, 0.5])
        hi_b = rng.choice([None, 1.0, 2, 0.5]) if lo_b is not None else rng.choice([1.0, 2])
        if lo_b is not None and hi_b is not None and lo_b > hi_b:
            lo_b, hi_b = hi_b, lo_b
        attrs = {"min": lo_b, "max": hi_b}
    if op == "pow_scalar":
        attrs = {"exponent": rng.choice([2, 3, 0.5, -1, 0, 1.5, -2])}
    return [x], [step(op, "y", ["x"], **attrs)]


def gen_rounding(rng):
    """erf, floor, ceil and round: floats (often exact halves, where round takes the even
    neighbour, or special values) and integers (copies; erf gives float32)."""
    op = rng.choice(["erf", "floor", "ceil", "round"])
    dtype = rng.choice(FLOAT + ["f32", "i32", "i64"])
    shape = random_shape(rng, allow_empty=True)
    values = None
    if is_float(dtype) and rng.random() < 0.5:
        values = [rng.randint(-12, 12) / 2 for _ in range(numel(shape))]
    x = tensor_input(rng, "x", dtype, shape, special=values is None and rng.random() < 0.4, values=values)
    return [x], [step(op, "y", ["x"])]


def gen_reduce(rng):
    op = rng.choice(["sum", "mean", "var", "prod", "norm", "max", "min", "max_dim", "min_dim", "argmax", "argmin",
                     "all", "any", "softmax", "log_softmax"])
    shape = random_shape(rng, max_dims=3, allow_empty=op in ("sum", "mean", "prod", "all", "any", "norm"))
    if op in ("max_dim", "min_dim", "argmax", "argmin", "softmax", "log_softmax") and not shape:
        shape = [rng.randint(1, 4)]
    floating_only = op in ("mean", "var", "norm", "softmax", "log_softmax")
    dtype = rng.choice(FLOAT if floating_only else ALL)
    if dtype == "bool" and op in ("max", "min", "max_dim", "min_dim", "argmax", "argmin", "prod"):
        dtype = "i32"
    x = tensor_input(rng, "x", dtype, shape, special=rng.random() < 0.2, lo=0.5 if op == "prod" else -3.0,
                     hi=1.5 if op == "prod" else 3.0)
    nd = len(shape)
    attrs = {}
    if op in ("sum", "mean", "var", "prod", "norm", "all", "any"):
        dims = sorted(rng.sample(range(nd), rng.randint(0, nd))) if nd else []
        attrs = {"dims": dims, "keepdim": rng.random() < 0.3}
        if op == "var":
            attrs["unbiased"] = rng.random() < 0.7
        if op == "norm":
            attrs["p"] = rng.choice([1, 2, 3, 0.5, math.inf])
    elif op in ("max_dim", "min_dim", "argmax", "argmin"):
        attrs = {"dim": rng.randint(-nd, nd - 1), "keepdim": rng.random() < 0.3}
    elif op in ("softmax", "log_softmax"):
        attrs = {"dim": rng.randint(-nd, nd - 1)}
    return [x], [step(op, "y", ["x"], **attrs)]


def gen_views(rng):
    shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
    x = tensor_input(rng, "x", rng.choice(FLOAT), shape, requires_grad=True)
    steps = []
    cur, cur_shape = "x", list(shape)
    for i in range(rng.randint(1, 3)):
        nd = len(cur_shape)
        kind = rng.choice(["transpose", "permute", "narrow", "slice", "select", "unsqueeze", "squeeze", "reshape",
                           "expand", "flatten", "t", "contiguous"])
        out = "v%d" % i
        if kind == "transpose" and nd >= 2:
            d0, d1 = rng.sample(range(nd), 2)
            steps.append(step("transpose", out, [cur], dim0=d0, dim1=d1))
            cur_shape[d0], cur_shape[d1] = cur_shape[d1], cur_shape[d0]
        elif kind == "permute" and nd >= 1:
            perm = list(range(nd))
            rng.shuffle(perm)
            steps.append(step("permute", out, [cur], dims=perm))
            cur_shape = [cur_shape[p] for p in perm]
        elif kind == "narrow" and nd >= 1 and all(s > 0 for s in cur_shape):
            d = rng.randrange(nd)
            start = rng.randint(0, cur_shape[d] - 1)
            length = rng.randint(0, cur_shape[d] - start)
            steps.append(step("narrow", out, [cur], dim=d, start=start, length=length))
            cur_shape[d] = length
        elif kind == "slice" and nd >= 1:
            d = rng.randrange(nd)
            start, end, st = rng.randint(0, cur_shape[d]), rng.randint(0, cur_shape[d] + 1), rng.randint(1, 2)
            steps.append(step("slice", out, [cur], dim=d, start=start, end=end, step=st))
            cur_shape[d] = max(0, (max(min(end, cur_shape[d]), start) - start + st - 1) // st)
        elif kind == "select" and nd >= 1 and all(s > 0 for s in cur_shape):
            d = rng.randrange(nd)
            idx = rng.randint(-cur_shape[d], cur_shape[d] - 1)
            steps.append(step("select", out, [cur], dim=d, index=idx))
            cur_shape.pop(d)
        elif kind == "unsqueeze":
            d = rng.randint(0, nd)
            steps.append(step("unsqueeze", out, [cur], dim=d))
            cur_shape.insert(d, 1)
        elif kind == "squeeze" and nd >= 1:
            d = rng.randrange(nd)
            steps.append(step("squeeze", out, [cur], dim=d))
            if cur_shape[d] == 1:
                cur_shape.pop(d)
        elif kind == "reshape":
            steps.append(step("reshape", out, [cur], shape=[-1]))
            cur_shape = [numel(cur_shape)]
        elif kind == "expand" and nd >= 1:
            target = [rng.choice([s, 2]) if s == 1 else s for s in cur_shape]
            steps.append(step("expand", out, [cur], shape=[rng.randint(1, 2)] + target))
            cur_shape = steps[-1]["attrs"]["shape"]
        elif kind == "flatten":
            steps.append(step("flatten", out, [cur]))
            cur_shape = [numel(cur_shape)]
        elif kind == "t" and nd <= 2:
            steps.append(step("t", out, [cur]))
            cur_shape = cur_shape[::-1]
        else:
            steps.append(step("contiguous", out, [cur]))
        cur = out
    steps.append(step("mul", "y", [cur, cur]))
    return [x], steps


def gen_matmul(rng):
    m, k, n = rng.randint(1, 4), rng.randint(0, 4), rng.randint(1, 4)
    kind = rng.choice(["vv", "mv", "vm", "mm", "bmm", "broadcast", "bad"])
    shapes = {"vv": ([k], [k]), "mv": ([m, k], [k]), "vm": ([k], [k, n]), "mm": ([m, k], [k, n]),
              "bmm": ([2, m, k], [2, k, n]), "broadcast": ([3, 1, m, k], [2, k, n]), "bad": ([m, k], [k + 1, n])}[kind]
    dtype = rng.choice(FLOAT)
    a = tensor_input(rng, "a", dtype, shapes[0])
    b = tensor_input(rng, "b", dtype if rng.random() < 0.95 else "i32", shapes[1])
    steps = [step("matmul", "y", ["a", "b"])]
    if rng.random() < 0.3:
        steps.append(step("transpose_last", "z", ["y"]))
    return [a, b], steps


def gen_indexing(rng):
    op = rng.choice(["index_select", "gather", "scatter_add", "cat", "stack", "masked_fill", "one_hot", "where"])
    dtype = rng.choice(FLOAT + ["i64", "i32"])
    shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
    x = tensor_input(rng, "x", dtype, shape)
    nd = len(shape)
    d = rng.randrange(nd)
    bad = rng.random() < 0.1

    def index_values(count, size):
        vals = [rng.randint(0, size - 1) for _ in range(count)]
        if bad and vals:
            vals[0] = rng.choice([-1, size, -size - 1])
        return vals

    if op == "index_select":
        count = rng.randint(0, 5)
        idx = tensor_input(rng, "i", rng.choice(["i64", "i32"]), [count], requires_grad=False,
                           values=index_values(count, shape[d]))
        return [x, idx], [step("index_select", "y", ["x", "i"], dim=d)]
    if op == "gather":
        ishape = [rng.randint(1, s) if k != d else rng.randint(1, 4) for k, s in enumerate(shape)]
        idx = tensor_input(rng, "i", "i64", ishape, requires_grad=False, values=index_values(numel(ishape), shape[d]))
        return [x, idx], [step("gather", "y", ["x", "i"], dim=d)]
    if op == "scatter_add":
        ishape = [rng.randint(1, s) for s in shape]
        idx = tensor_input(rng, "i", "i64", ishape, requires_grad=False, values=index_values(numel(ishape), shape[d]))
        src = tensor_input(rng, "s", dtype, ishape)
        return [x, idx, src], [step("scatter_add", "y", ["x", "i", "s"], dim=d)]
    if op in ("cat", "stack"):
        other_shape = list(shape)
        if op == "cat":
            other_shape[d] = rng.randint(0, 3)
        if bad:
            other_shape[(d + 1) % nd] += 1
        parts = [x, tensor_input(rng, "b", dtype, other_shape)]
        if op == "cat" and rng.random() < 0.2:
            parts.append(tensor_input(rng, "e", dtype, [0]))
        return parts, [step(op, "y", [p["name"] for p in parts], dim=d)]
    if op == "masked_fill":
        mask = tensor_input(rng, "m", "bool", broadcastable(rng, shape), requires_grad=False)
        return [x, mask], [step("masked_fill", "y", ["x", "m"], value=rng.choice([0, -1.5, math.inf]))]
    if op == "one_hot":
        idx = tensor_input(rng, "i", "i64", shape, requires_grad=False, values=index_values(numel(shape), 5))
        return [idx], [step("one_hot", "y", ["i"], num_classes=rng.choice([-1, 5, 6]))]
    cond = tensor_input(rng, "c", "bool", broadcastable(rng, shape), requires_grad=False)
    other = tensor_input(rng, "b", rng.choice([dtype, "f64", "i64"]), broadcastable(rng, shape))
    return [cond, x, other], [step("where", "y", ["c", "x", "b"])]


def gen_losses(rng):
    op = rng.choice(["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "bce_with_logits"])
    reduction = rng.choice(["mean", "sum", "none"])
    dtype = rng.choice(FLOAT)
    if op in ("cross_entropy", "nll_loss"):
        rows, classes = rng.randint(1, 5), rng.randint(2, 5)
        shape = [rows, classes] + ([rng.randint(1, 3)] if rng.random() < 0.2 else [])
        x = tensor_input(rng, "x", dtype, shape, special=rng.random() < 0.05)
        tshape = [rows] + shape[2:]
        t = tensor_input(rng, "t", "i64", tshape, requires_grad=False,
                         values=[rng.randint(0, classes - 1) for _ in range(numel(tshape))])
        if rng.random() < 0.05:
            t["values"][0] = classes  # out of range
        attrs = {"reduction": reduction}
        if op == "cross_entropy":
            attrs["label_smoothing"] = rng.choice([0.0, 0.0, 0.1, 0.3])
        steps = [step("log_softmax", "lp", ["x"], dim=1), step("nll_loss", "y", ["lp", "t"], reduction=reduction)] \
            if op == "nll_loss" else [step(op, "y", ["x", "t"], **attrs)]
        return [x, t], steps
    shape = random_shape(rng, allow_empty=True)
    x = tensor_input(rng, "x", dtype, shape)
    t = tensor_input(rng, "t", dtype, shape if rng.random() < 0.95 else shape + [2],
                     requires_grad=rng.random() < 0.3, lo=0.0 if op == "bce_with_logits" else -3.0, hi=1.0 if op == "bce_with_logits" else 3.0)
    return [x, t], [step(op, "y", ["x", "t"], reduction=reduction)]


def gen_norms(rng):
    op = rng.choice(["layer_norm", "group_norm", "l1_norm", "frobenius_norm", "softmax", "log_softmax"])
    dtype = rng.choice(FLOAT)
    if op == "layer_norm":
        shape = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
        k = rng.randint(1, len(shape))
        ns = shape[len(shape) - k:]
        inputs = [tensor_input(rng, "x", dtype, shape, lo=-3 + 100 * (rng.random() < 0.1), hi=3 + 100 * (rng.random() < 0.1))]
        args = ["x"]
        if rng.random() < 0.7:
            inputs.append(tensor_input(rng, "w", dtype, ns))
            inputs.append(tensor_input(rng, "b", dtype, ns))
            args += ["w", "b"]
        return inputs, [step("layer_norm", "y", args, normalized_shape=ns, eps=1e-5)]
    if op == "group_norm":
        groups = rng.choice([1, 2, 3])
        channels = groups * rng.randint(1, 3)
        shape = [rng.randint(1, 3), channels] + [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        inputs = [tensor_input(rng, "x", dtype, shape)]
        args = ["x"]
        if rng.random() < 0.7:
            inputs += [tensor_input(rng, "w", dtype, [channels]), tensor_input(rng, "b", dtype, [channels])]
            args += ["w", "b"]
        return inputs, [step("group_norm", "y", args, num_groups=groups, eps=1e-5)]
    shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
    x = tensor_input(rng, "x", dtype, shape, special=rng.random() < 0.1)
    if op == "l1_norm":
        return [x], [step("l1_norm", "y", ["x"], dim=rng.randrange(len(shape)), eps=1e-12)]
    if op == "frobenius_norm":
        return [x], [step("frobenius_norm", "y", ["x"], eps=1e-12)]
    return [x], [step(op, "y", ["x"], dim=rng.randrange(len(shape)))]


def gen_promotion(rng):
    da, db = rng.choice(ALL + ["f16", "bf16"]), rng.choice(ALL + ["f16", "bf16"])
    a = tensor_input(rng, "a", da, random_shape(rng, max_dims=2))
    b = tensor_input(rng, "b", db, [] if rng.random() < 0.5 else random_shape(rng, max_dims=2))
    for t in (a, b):
        if t["dtype"] in ("f16", "bf16"):
            t["requires_grad"] = False
    op = rng.choice(["add", "mul", "div", "maximum", "where_scalar", "to"])
    if op == "to":
        return [a], [step("to", "y", ["a"], dtype=rng.choice(ALL + ["f16", "bf16"]))]
    if op == "where_scalar":
        c = tensor_input(rng, "c", "bool", a["shape"], requires_grad=False)
        return [c, a], [step("where_scalar", "y", ["c", "a"], scalar=rng.choice([0, 1.5, True, -3]))]
    # Bool operands of maximum and of a bool-bool add (both logical or) are the broadcast
    # family's; here they become add and mul, whose promotion is the point.
    if op == "maximum" and "bool" in (da, db):
        op = "add"
    if op == "add" and da == db == "bool":
        op = "mul"
    return [a, b], [step(op, "y", ["a", "b"])]


def gen_autograd(rng):
    kind = rng.choice(["diamond", "reuse", "detach", "inplace_saved", "inplace_unsaved", "chain"])
    x = tensor_input(rng, "x", rng.choice(FLOAT), [rng.randint(1, 4)], requires_grad=True)
    w = tensor_input(rng, "w", x["dtype"], x["shape"], requires_grad=False)
    if kind == "diamond":
        return [x], [step("exp", "a", ["x"]), step("sin", "b", ["x"]), step("mul", "c", ["a", "b"]),
                     step("add", "y", ["c", "x"])]
    if kind == "reuse":
        return [x], [step("mul", "a", ["x", "x"]), step("mul", "y", ["a", "x"])]
    if kind == "detach":
        return [x], [step("detach", "d", ["x"]), step("mul", "a", ["x", "d"]), step("add", "y", ["a", "x"])]
    if kind == "inplace_saved":
        return [x, w], [step("mul", "y", ["x", "w"]), step("fill_", "w", ["w"], value=0.0)]
    if kind == "inplace_unsaved":
        return [x, w], [step("add", "y", ["x", "w"]), step("fill_", "w", ["w"], value=0.0)]
    steps, cur = [], "x"
    for i in range(rng.randint(2, 6)):
        op = rng.choice(["tanh", "sigmoid", "mul_self", "neg", "exp_small"])
        out = "c%d" % i
        if op == "mul_self":
            steps.append(step("mul", out, [cur, cur]))
        elif op == "exp_small":
            steps.append(step("mul_scalar", out + "s", [cur], scalar=0.1))
            steps.append(step("exp", out, [out + "s"]))
        else:
            steps.append(step(op, out, [cur]))
        cur = out
    steps.append(step("add", "y", [cur, "x"]))
    return [x], steps


# The edges: scalars a dtype may not hold, written by each op that writes one; integer powers
# past the dtype; cross_entropy's ignored rows (all of them, a class as ignore_index, NaN and
# infinite logits in them); writes into an expand() view; one value per group or channel;
# empty dims in pooling; attention, saturated softmax included.
FIT_VALUES = [1e6, -1e6, 65504.0, 65519.0, 1e39, -1e39, math.inf, -math.inf, math.nan, 300, 255, -3, -255, -256,
              2 ** 40, 1.5, 7]


def gen_edges(rng):
    kind = rng.choice(["ignored"] * 3 + ["fit"] * 3 + ["pow", "one_value", "overlap", "pool", "attention", "attention"])
    if kind == "ignored":
        rows, classes = rng.randint(1, 4), rng.randint(2, 5)
        ignore = rng.choice([-100, rng.randrange(classes)])
        everything = rng.random() < 0.3
        targets = [ignore if everything or rng.random() < 0.4 else rng.randrange(classes) for _ in range(rows)]
        dtype = rng.choice(FLOAT)
        values = random_values(rng, dtype, rows * classes)
        ignored = [r for r in range(rows) if targets[r] == ignore]
        if ignored and rng.random() < 0.4:
            values[rng.choice(ignored) * classes + rng.randrange(classes)] = rng.choice([math.nan, math.inf, -math.inf])
        x = tensor_input(rng, "x", dtype, [rows, classes], requires_grad=True, values=values)
        t = tensor_input(rng, "t", "i64", [rows], requires_grad=False, values=targets)
        # The kept rows, for the program that computes normcore's outcome (deliberate()).
        k = tensor_input(rng, "k", "bool", [rows, 1], requires_grad=False, values=[v != ignore for v in targets])
        return [x, t, k], [step("cross_entropy", "y", ["x", "t"], reduction=rng.choice(["mean", "sum", "none"]),
                                label_smoothing=rng.choice([0.0, 0.0, 0.2]), ignore_index=ignore)]
    if kind == "fit":
        op = rng.choice(["full", "filled", "masked_fill", "where_scalar", "clamp"])
        dtype = rng.choice(["f16", "bf16", "f32", "u8", "i32"])
        value = rng.choice(FIT_VALUES)
        shape = [rng.randint(1, 3)]
        x = tensor_input(rng, "x", dtype, shape, requires_grad=False)
        if op == "full":
            return [], [step("full", "y", [], shape=shape, value=value, dtype=dtype)]
        if op == "filled":
            return [x], [step("filled", "y", ["x"], value=value)]
        if op == "clamp":
            if isinstance(value, float) and math.isnan(value):
                value = 300
            bound = rng.choice(["min", "max"])
            return [x], [step("clamp", "y", ["x"], **{bound: value, ("max" if bound == "min" else "min"): None})]
        mask = tensor_input(rng, "m", "bool", shape, requires_grad=False)
        if op == "masked_fill":
            return [x, mask], [step("masked_fill", "y", ["x", "m"], value=value)]
        return [mask, x], [step("where_scalar", "y", ["m", "x"], scalar=value)]
    if kind == "pow":
        dtype = rng.choice(["u8", "i32", "i64", "f16", "f32"])
        exponent = rng.choice([0, 3, 255, 256, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 62, 1e6, -1])
        shape = [rng.randint(1, 4)]
        values = [rng.choice([0, 1, 2, 3] + ([-1, -2] if dtype in ("i32", "i64") else [])) for _ in range(shape[0])] \
            if dtype in INT else None
        x = tensor_input(rng, "x", dtype, shape, requires_grad=False, values=values)
        return [x], [step("pow_scalar", "y", ["x"], exponent=exponent)]
    if kind == "one_value":
        dtype = rng.choice(FLOAT)
        channels = rng.randint(1, 4)
        if rng.random() < 0.5:
            shape = rng.choice([[1, channels], [1, channels, 1], [2, channels], [1, 2 * channels], [1, channels, 1, 1]])
            x = tensor_input(rng, "x", dtype, shape, requires_grad=rng.random() < 0.5)
            return [x], [step("group_norm", "y", ["x"], num_groups=channels, eps=1e-5)]
        shape = rng.choice([[1, channels], [1, channels, 1, 1], [2, channels], [1, channels, 2]])
        x = tensor_input(rng, "x", dtype, shape, requires_grad=rng.random() < 0.5)
        return [x], [step("batch_norm", "y", ["x"], eps=rng.choice([1e-5, 1e-5, 0.0]))]
    if kind == "overlap":
        base, target = rng.choice([([1, 3], [2, 3]), ([3], [1, 3]), ([2, 1], [2, 3]), ([2, 3], [2, 3]), ([1], [4]),
                                   ([1, 1], [1, 1])])
        dtype = rng.choice(FLOAT)
        x = tensor_input(rng, "x", dtype, base, requires_grad=False)
        if rng.random() < 0.5:
            return [x], [step("expand_fill_", "y", ["x"], shape=target, value=rng.choice([0.0, 2.5, -1]))]
        src = tensor_input(rng, "s", dtype, rng.choice([target, target[-1:]]), requires_grad=False)
        return [x, src], [step("expand_copy_", "y", ["x", "s"], shape=target)]
    if kind == "pool":
        op = rng.choice(["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"])
        shape = rng.choice([[2, 0, 4, 4], [0, 3, 4, 4], [0, 4, 4], [2, 3, 0, 4], [1, 2, 4, 4], [2, 4, 4], [0, 0, 4, 4],
                            [2, 2, 4, 0]])
        x = tensor_input(rng, "x", rng.choice(FLOAT), shape)
        return [x], [step(op, "y", ["x"])]
    dtype = rng.choice(["f32", "f64", "f64"])
    batch, heads, L, S = rng.randint(1, 2), rng.choice([1, 2, 4]), rng.randint(1, 5), rng.randint(1, 6)
    # Grouped-query and multi-query attention: fewer k, v heads (a divisor of q's), and now
    # and then a head count that does not divide, which PyTorch refuses.
    kv_heads = rng.choice([h for h in (1, 2, 4) if heads % h == 0] + ([3] if rng.random() < 0.1 else []))
    D, Dv = rng.choice([2, 4, 8]), rng.choice([2, 4, 8])
    saturation = rng.choice([1, 1, 10, 30])
    q = tensor_input(rng, "q", dtype, [batch, heads, L, D], requires_grad=True, lo=-3 * saturation, hi=3 * saturation)
    k = tensor_input(rng, "k", dtype, [batch, kv_heads, S, D], requires_grad=True)
    v = tensor_input(rng, "v", dtype, [batch, kv_heads, S, Dv], requires_grad=True)
    return [q, k, v], [step("sdpa", "y", ["q", "k", "v"], causal=rng.random() < 0.5,
                            enable_gqa=kv_heads != heads or rng.random() < 0.2)]


GENERATORS = {"broadcast": gen_broadcast, "scalar": gen_scalar, "unary": gen_unary, "reduce": gen_reduce,
              "views": gen_views, "matmul": gen_matmul, "indexing": gen_indexing, "losses": gen_losses,
              "norms": gen_norms, "promotion": gen_promotion, "autograd": gen_autograd, "edges": gen_edges,
              "rounding": gen_rounding}


# ---------------------------------------------------------------- running a program
def run_step(env, s, wide):
    op, a, at = s["op"], [env[n] for n in s["args"]], s["attrs"]
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
              "minimum": torch.minimum, "pow": torch.pow, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
              "le": torch.le, "gt": torch.gt, "ge": torch.ge}
    unary = {"neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "relu": torch.relu, "exp": torch.exp,
             "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos,
             "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "floor": torch.floor,
             "ceil": torch.ceil, "round": torch.round}
    F = torch.nn.functional
    if op in binary:
        return binary[op](a[0], a[1])
    if op == "pow_scalar":
        return torch.pow(a[0], at["exponent"])
    if op.endswith("_scalar") and op[:-7] in ("maximum", "minimum"):
        # PyTorch has no maximum(tensor, number): the number becomes a tensor of the dtype
        # that tensor-and-number promotion gives.
        other = torch.tensor(at["scalar"], dtype=torch.result_type(a[0], at["scalar"]))
        return binary[op[:-7]](a[0], other)
    if op.endswith("_scalar") and op[:-7] in binary:
        return binary[op[:-7]](a[0], at["scalar"])
    if op.endswith("_rscalar"):
        fn = {"add": lambda t, s: s + t, "sub": lambda t, s: s - t, "mul": lambda t, s: s * t,
              "div": lambda t, s: s / t}[op[:-8]]
        return fn(a[0], at["scalar"])
    if op in unary:
        return unary[op](a[0])
    if op == "gelu":
        return F.gelu(a[0])
    if op == "gelu_tanh":
        return F.gelu(a[0], approximate="tanh")
    if op == "clamp":
        return torch.clamp(a[0], at["min"], at["max"])
    if op in ("sum", "mean", "prod", "all", "any"):
        dims = at["dims"]
        x = a[0]
        if op == "prod":
            if not dims:
                r = torch.prod(x)
                return r.reshape([1] * x.dim()) if at["keepdim"] else r
            for d in sorted(dims, reverse=True):
                x = torch.prod(x, d, keepdim=at["keepdim"])
            return x
        if op in ("all", "any"):
            fn = torch.all if op == "all" else torch.any
            if not dims:
                r = fn(x)
                return r.reshape([1] * x.dim()) if at["keepdim"] else r
            for d in sorted(dims, reverse=True):
                x = fn(x, d, keepdim=at["keepdim"])
            return x
        fn = torch.sum if op == "sum" else torch.mean
        return fn(x, dim=tuple(dims) if dims else tuple(range(x.dim())), keepdim=at["keepdim"]) if x.dim() else fn(x)
    if op == "var":
        x = a[0]
        dims = tuple(at["dims"]) if at["dims"] else tuple(range(x.dim()))
        return torch.var(x, dim=dims if x.dim() else None, unbiased=at["unbiased"], keepdim=at["keepdim"]) \
            if x.dim() else torch.var(x, unbiased=at["unbiased"])
    if op == "norm":
        x = a[0]
        dims = tuple(at["dims"]) if at["dims"] else None
        return torch.linalg.vector_norm(x, ord=at["p"], dim=dims, keepdim=at["keepdim"])
    if op in ("max", "min"):
        return (torch.max if op == "max" else torch.min)(a[0])
    if op in ("max_dim", "min_dim"):
        return (torch.max if op == "max_dim" else torch.min)(a[0], at["dim"], keepdim=at["keepdim"]).values
    if op in ("argmax", "argmin"):
        return (torch.argmax if op == "argmax" else torch.argmin)(a[0], at["dim"], keepdim=at["keepdim"])
    if op in ("softmax", "log_softmax"):
        return (torch.softmax if op == "softmax" else torch.log_softmax)(a[0], at["dim"])
    if op == "matmul":
        return torch.matmul(a[0], a[1])
    if op == "transpose_last":
        return a[0].transpose(-1, -2) if a[0].dim() >= 2 else a[0]
    if op == "transpose":
        return a[0].transpose(at["dim0"], at["dim1"])
    if op == "permute":
        return a[0].permute(*at["dims"])
    if op == "narrow":
        return a[0].narrow(at["dim"], at["start"], at["length"])
    if op == "slice":
        idx = [slice(None)] * a[0].dim()
        idx[at["dim"]] = slice(at["start"], at["end"], at["step"])
        return a[0][tuple(idx)]
    if op == "select":
        return a[0].select(at["dim"], at["index"])
    if op == "unsqueeze":
        return a[0].unsqueeze(at["dim"])
    if op == "squeeze":
        return a[0].squeeze(at["dim"])
    if op == "reshape":
        return a[0].reshape(at["shape"])
    if op == "expand":
        return a[0].expand(*at["shape"])
    if op == "flatten":
        return a[0].flatten()
    if op == "t":
        return a[0].t()
    if op == "contiguous":
        return a[0].contiguous()
    if op == "index_select":
        return torch.index_select(a[0], at["dim"], a[1])
    if op == "gather":
        return torch.gather(a[0], at["dim"], a[1])
    if op == "scatter_add":
        return torch.scatter_add(a[0], at["dim"], a[1], a[2])
    if op == "cat":
        return torch.cat(a, at["dim"])
    if op == "stack":
        return torch.stack(a, at["dim"])
    if op == "masked_fill":
        return a[0].masked_fill(a[1], at["value"])
    if op == "one_hot":
        return F.one_hot(a[0], at["num_classes"])
    if op == "where":
        return torch.where(a[0], a[1], a[2])
    if op == "where_scalar":
        return torch.where(a[0], a[1], at["scalar"])
    if op == "cross_entropy":
        return F.cross_entropy(a[0], a[1], reduction=at["reduction"], label_smoothing=at["label_smoothing"],
                               ignore_index=at.get("ignore_index", -100))
    if op == "nll_loss":
        return F.nll_loss(a[0], a[1], reduction=at["reduction"])
    if op == "mse_loss":
        return F.mse_loss(a[0], a[1], reduction=at["reduction"])
    if op == "l1_loss":
        return F.l1_loss(a[0], a[1], reduction=at["reduction"])
    if op == "bce_with_logits":
        return F.binary_cross_entropy_with_logits(a[0], a[1], reduction=at["reduction"])
    if op == "layer_norm":
        return F.layer_norm(a[0], at["normalized_shape"], *(a[1:3] if len(a) > 1 else (None, None)), eps=at["eps"])
    if op == "group_norm":
        # F.group_norm refuses a batch of one value per group, as normcore does.
        return F.group_norm(a[0], at["num_groups"], *(a[1:3] if len(a) > 1 else (None, None)), eps=at["eps"])
    if op == "batch_norm":
        return F.batch_norm(a[0], None, None, training=True, eps=at["eps"])
    if op in ("max_pool2d", "avg_pool2d"):
        return (F.max_pool2d if op == "max_pool2d" else F.avg_pool2d)(a[0], 2)
    if op == "adaptive_avg_pool2d":
        return F.adaptive_avg_pool2d(a[0], 1)
    if op == "sdpa":
        return F.scaled_dot_product_attention(a[0], a[1], a[2], is_causal=at["causal"],
                                              enable_gqa=at.get("enable_gqa", False))
    if op == "l1_norm":
        return a[0] / torch.clamp(torch.mean(torch.abs(a[0]), at["dim"], keepdim=True), min=at["eps"])
    if op == "frobenius_norm":
        # The subgradient of the norm at 0 is 0 (vector_norm's, and normcore's contract); the
        # norm below eps is replaced by eps, no gradient flowing through the comparison.
        n = torch.linalg.vector_norm(a[0])
        return a[0] / torch.where(n < at["eps"], torch.full_like(n, at["eps"]), n)
    if op == "to":
        dtype = TORCH[at["dtype"]]
        if wide and dtype.is_floating_point:
            dtype = torch.float64
        return a[0].to(dtype)
    if op == "detach":
        return a[0].detach()
    if op == "fill_":
        with torch.no_grad():
            return a[0].fill_(at["value"])
    if op == "filled":
        with torch.no_grad():
            return a[0].clone().fill_(at["value"])
    if op == "full":
        dtype = TORCH[at["dtype"]]
        if wide and dtype.is_floating_point:
            # The value is checked against the case dtype, then computed wide like the rest.
            torch.full(at["shape"], at["value"], dtype=dtype)
            dtype = torch.float64
        return torch.full(at["shape"], at["value"], dtype=dtype)
    if op in ("expand_copy_", "expand_fill_"):
        with torch.no_grad():
            y = a[0].clone().expand(*at["shape"])
            return y.copy_(a[1]) if op == "expand_copy_" else y.fill_(at["value"])
    raise KeyError("unknown op " + op)


def encode(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def tensor_json(t, dtype=None):
    """dtype: the name to record when t is the float64 stand-in of a narrower tensor."""
    t = t.detach().cpu()
    name = dtype or NAME.get(t.dtype, str(t.dtype))
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32):
        t = t.double()
    return {"dtype": name, "shape": list(t.shape),
            "values": [encode(v) for v in t.reshape(-1).tolist()]}


def run_program(inputs, steps, grad_out_values, wide):
    env = {}
    leaves = {}
    for inp in inputs:
        dtype = TORCH[inp["dtype"]]
        if wide and dtype.is_floating_point:
            dtype = torch.float64
        values = [float(v) if isinstance(v, str) else v for v in inp["values"]]
        t = torch.tensor(values, dtype=torch.float64 if TORCH[inp["dtype"]].is_floating_point else None)
        t = t.to(TORCH[inp["dtype"]]).to(dtype).reshape(inp["shape"])  # rounded to the case dtype first
        if inp["requires_grad"]:
            t.requires_grad_()
        env[inp["name"]] = t
        leaves[inp["name"]] = t
    for s in steps:
        env[s["out"]] = run_step(env, s, wide)
    result = env[steps[-1]["out"]] if steps[-1]["op"] != "fill_" else env[steps[-2]["out"]]
    grads = None
    if result.requires_grad and grad_out_values is not None:
        g = torch.tensor(grad_out_values, dtype=result.dtype).reshape(result.shape)
        result.backward(g)
        grads = {name: (None if t.grad is None else t.grad) for name, t in leaves.items() if t.requires_grad}
    return result, grads


# What PyTorch raises when it refuses a program (anything else is a fault of this script).
PYTORCH_ERRORS = (RuntimeError, IndexError, ValueError, TypeError)
RTOL = {"f64": 1e-9, "f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}


class NoKernel(Exception):
    """PyTorch's build has no kernel for the program: it says nothing about semantics."""


def first_line(exc):
    text = str(exc)
    if "not implemented for" in text:
        raise NoKernel(text)
    return text.split("\n")[0][:160]


def evaluate(inputs, steps, grad_out_for):
    """PyTorch's outcome: {"error": "forward"|"backward", "message"} or the result (in the case
    dtypes), its float64 values and gradients, and the gradients in the case dtypes."""
    try:
        result, _ = run_program(inputs, steps, None, wide=False)
    except PYTORCH_ERRORS as exc:
        return {"error": "forward", "message": first_line(exc)}
    wants_grad = result.dtype.is_floating_point and result.requires_grad and result.numel() > 0
    grad_out = grad_out_for(result.numel()) if wants_grad else None
    try:
        wide, grads = run_program(inputs, steps, grad_out, wide=True)
    except PYTORCH_ERRORS as exc:
        message = first_line(exc)
        run_program(inputs, steps, None, wide=True)  # the forward runs: the backward refused
        return {"error": "backward", "message": message}
    narrow_grads = None
    if wants_grad:
        try:
            narrow_grads = run_program(inputs, steps, grad_out, wide=False)[1]
        except PYTORCH_ERRORS as exc:
            first_line(exc)
    return {"result": result, "wide": wide, "grad_out": grad_out, "grads": grads, "narrow_grads": narrow_grads}


def close(a, b, rtol):
    """The replayer's comparison (tests/conformance/test_differential.cpp): NaN with NaN, infinities exact,
    finite values within rtol of the largest magnitude (at least 1)."""
    a, b = a.detach().double().reshape(-1).tolist(), b.detach().double().reshape(-1).tolist()
    finite = [abs(v) for v in b if math.isfinite(v)]
    tol = rtol * max([1.0] + finite)
    for x, y in zip(a, b):
        if math.isnan(y) or math.isinf(y):
            if not (math.isnan(x) if math.isnan(y) else x == y):
                return False
        elif not math.isfinite(x) or abs(x - y) > tol:
            return False
    return True


def well_conditioned(outcome, inputs):
    """Whether the case dtypes reproduce the float64 answer: a program whose float32 result
    overflows, or cancels away its digits, compares rounding, not semantics."""
    result = outcome["result"]
    rtol = RTOL.get(NAME[result.dtype], 0.0)
    if result.dtype in (torch.float32,) and not close(result, outcome["wide"], rtol):
        return False
    if outcome["grads"] is None:
        return True
    if outcome["narrow_grads"] is None:
        return False
    for inp in inputs:
        wide, narrow = outcome["grads"].get(inp["name"]), outcome["narrow_grads"].get(inp["name"])
        if (wide is None) != (narrow is None):
            return False
        if wide is not None and not close(narrow, wide, max(rtol, RTOL[inp["dtype"]])):
            return False
    return True


# ---------------------------------------------------------------- deliberate differences
# Where normcore departs from PyTorch on purpose (docs/ERRORS.md, "Where normcore differs from
# PyTorch"). Each returns None, or normcore's outcome: "refuses", or a program PyTorch runs to
# compute what normcore computes.
def dtype_of(inputs, name):
    return next((inp["dtype"] for inp in inputs if inp["name"] == name), None)


# The largest finite values of the narrow floating dtypes.
LARGEST = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38}


def nonfinite_in_ignored_row(inputs, logits, target):
    x = next(inp for inp in inputs if inp["name"] == logits)
    kept = next(inp for inp in inputs if inp["name"] == "k")["values"]
    classes = x["shape"][1]
    return any(not kept[r] and not all(math.isfinite(v) for v in x["values"][r * classes:(r + 1) * classes])
               for r in range(len(kept)))


def deliberate(inputs, steps, outcome):
    ran = "error" not in outcome
    for s in steps:
        op, args, at = s["op"], s["args"], s["attrs"]
        if op == "cross_entropy" and ran and dtype_of(inputs, "k") == "bool" and \
                nonfinite_in_ignored_row(inputs, args[0], args[1]):
            # The ignored rows' logits replaced by zeros: the same loss, a zero gradient there.
            return "cross-entropy-ignored-nonfinite", [step("where_scalar", "__kept", ["k", args[0]], scalar=0.0),
                                                       step(op, s["out"], ["__kept", args[1]], **at)] + steps[1:]
        if op in ("filled", "full") and ran:
            dtype = at["dtype"] if op == "full" else dtype_of(inputs, args[0])
            value = at["value"]
            # PyTorch ran it: a one-element tensor, which it fills without the overflow check.
            if dtype in LARGEST and not isinstance(value, bool) and math.isfinite(value) and abs(value) > LARGEST[dtype]:
                return "fill-one-element", "refuses"
        if op == "where_scalar" and ran and dtype_of(inputs, args[1]) in ("f16", "bf16", "f32"):
            value = at["scalar"]
            if not isinstance(value, bool) and math.isfinite(value) and abs(value) > LARGEST[dtype_of(inputs, args[1])]:
                return "where-scalar-overflow", "refuses"
        if op == "masked_fill" and ran and dtype_of(inputs, args[0]) not in FLOAT + ["f16", "bf16"]:
            value = at["value"]
            if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
                return "masked_fill-inexact-value", "refuses"
        if op in ("mse_loss", "l1_loss", "bce_with_logits") and ran:
            shapes = [inp["shape"] for inp in inputs if inp["name"] in args]
            if shapes[0] != shapes[1]:
                return "loss-shapes", "refuses"
        if op == "matmul" and ran and dtype_of(inputs, args[0]) != dtype_of(inputs, args[1]):
            return "matmul-dtypes", "refuses"
        if op in ("all", "any") and ran and outcome["result"].dtype == torch.uint8:
            return "all-any-bool", steps + [step("to", "__bool", [s["out"]], dtype="bool")]
        if op == "pow" and ran and dtype_of(inputs, args[0]) in INT and outcome["result"].dtype == torch.float64:
            cast = step("to", "__base", [args[0]], dtype="f64")
            return "pow-integer-base", [cast, step("pow", s["out"], ["__base", args[1]])] + steps[1:]
        if op == "pow" and outcome.get("error") == "backward" and dtype_of(inputs, args[1]) == "bool":
            a_dtype = dtype_of(inputs, args[0])
            cast = step("to", "__exponent", [args[1]], dtype=a_dtype)
            return "pow-bool-exponent", [cast, step("pow", s["out"], [args[0], "__exponent"])] + steps[1:]
    return None


def make_case(rng, family, index, dropped):
    inputs, steps = GENERATORS[family](rng)
    case = {"id": "%s-%d" % (family, index), "family": family, "inputs": inputs, "steps": steps}
    draws = []

    def grad_out_for(n):
        if not draws:
            draws.append([round(rng.uniform(-1, 1), 3) for _ in range(n)])
        return draws[0]

    try:
        outcome = evaluate(inputs, steps, grad_out_for)
        difference = deliberate(inputs, steps, outcome)
        if difference is not None:
            case["differs"] = difference[0]
            case["pytorch"] = outcome["message"] if "error" in outcome else "runs"
            if difference[1] == "refuses":
                outcome = {"error": "forward", "message": "normcore refuses (docs/ERRORS.md)"}
            else:
                outcome = evaluate(inputs, difference[1], grad_out_for)
    except NoKernel:
        dropped["no kernel"] += 1
        return None
    if "error" in outcome:
        case["error"] = outcome["error"]
        case["pytorch_error"] = outcome["message"]
        return case
    if not well_conditioned(outcome, inputs):
        dropped["ill-conditioned"] += 1
        return None
    result = outcome["result"]
    case["result"] = tensor_json(result)
    case["rtol"] = RTOL.get(case["result"]["dtype"], 0.0)
    if result.dtype.is_floating_point and result.dtype not in (torch.float16, torch.bfloat16):
        # f16 and bf16 results keep PyTorch's own rounding: the f64 run would skip it.
        case["result"]["values"] = tensor_json(outcome["wide"])["values"]
    if outcome["grads"] is not None:
        case["grad_out"] = outcome["grad_out"]
        dtypes = {inp["name"]: inp["dtype"] for inp in inputs}
        case["grads"] = {name: (None if g is None else tensor_json(g, dtypes[name]))
                         for name, g in outcome["grads"].items()}
    return case


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/data/differential/cases.jsonl.gz")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    header = {"generator": "tests/differential/generate.py", "seed": args.seed, "counts": COUNTS,
              "pytorch": torch.__version__}
    cases, written, dropped = [], {}, {"no kernel": 0, "ill-conditioned": 0}
    for family, count in COUNTS.items():
        rng = random.Random("%d-%s" % (args.seed, family))
        made = [c for c in (make_case(rng, family, i, dropped) for i in range(count)) if c is not None]
        cases += made
        written[family] = len(made)
    # "cases" counts what was written; "left_out" what was not: programs PyTorch has no
    # kernel for, and those whose float32 answer is not the float64 one within the tolerance.
    header["cases"] = written
    header["left_out"] = dropped
    with gzip.open(args.out, "wt", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for case in cases:
            f.write(json.dumps(encode_all(case), separators=(",", ":"), allow_nan=False) + "\n")
    differs = {}
    for c in cases:
        if "differs" in c:
            differs[c["differs"]] = differs.get(c["differs"], 0) + 1
    print("wrote", sum(written.values()), "cases", written, "left out", dropped, "deliberate differences", differs,
          "with PyTorch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
