"""LLVM-level helpers for the numba kernels: bit casts and a vectorisable float max.

numba has no scalar bit cast between floats and integers, and its ``max`` on floats
lowers to a compare-and-select that LLVM does not vectorise as a reduction; these
intrinsics emit the LLVM instructions directly.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload


@intrinsic
def _bits_f32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _f32_from_bits(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _bits_f64(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _f64_from_bits(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def fmax(typingctx, a, b):
    """``llvm.maxnum``: the larger of ``a`` and ``b``, ignoring a NaN operand.

    LLVM vectorises reductions written with it (AVX2: ``vmaxps``), unlike ``max``.
    """
    if a != b or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maxnum", [t], ir.FunctionType(t, [t, t]))
        return builder.call(fn, args)
    return a(a, b), codegen


def cast_like(value, like):
    """``value`` converted to the type of ``like`` (inside numba code): keeps float32 kernels float32."""
    raise NotImplementedError("call from numba-compiled code")


@overload(cast_like, inline="always")
def _ov_cast_like(value, like):
    target = like

    def impl(value, like):
        return target(value)
    return impl
