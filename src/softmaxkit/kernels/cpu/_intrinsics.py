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


@intrinsic
def fused_multiply_add(typingctx, a, b, c):
    """``llvm.fma``: ``a b + c`` with one rounding (a ``vfmadd`` where the CPU has FMA), whatever
    the fast-math flags; the exact product is what an error-free range reduction needs."""
    if not (a == b == c) or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)
    return a(a, b, c), codegen


@intrinsic
def held_constant(typingctx, x):
    """``x``, a float constant, kept in a register (or a stack slot) across the loop that uses
    it, off AVX-512.

    numba compiles with LLVM's large code model, where every use of a vector constant inside
    a loop is rematerialised as an address load and a broadcast from the constant pool (two
    instructions per constant per iteration), rather than kept live. On AVX2 the float32
    exponential's dozen constants doubled its loop. Passing each through
    ``llvm.arithmetic.fence`` (a no-op in the generated code; LICM hoists it) makes the value
    opaque to rematerialisation, so it is held or reloaded straight into the arithmetic as a
    memory operand. The result is bit for bit the same. With AVX-512 (32 registers, embedded
    broadcasts) the constant is left as it is.
    """
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        if WIDE_VECTORS:
            return args[0]
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.arithmetic.fence", [t], ir.FunctionType(t, [t]))
        return builder.call(fn, args)
    return x(x), codegen


def cast_like(value, like):
    """``value`` converted to the type of ``like`` (inside numba code): keeps float32 kernels float32."""
    raise NotImplementedError("call from numba-compiled code")


@overload(cast_like, inline="always")
def _ov_cast_like(value, like):
    target = like

    def impl(value, like):
        return target(value)
    return impl


def _host_vector_isa() -> str:
    import llvmlite.binding as ll
    from numba import config
    # NUMBA_CPU_FEATURES, when set, is what numba compiles for (config sets it at import)
    features = set((getattr(config, "CPU_FEATURES", None) or ll.get_host_cpu_features().flatten()).split(","))
    if "+avx512f" in features:
        return "avx512"
    return "avx2" if {"+avx2", "+fma"} <= features else "other"


_AMD_CPU_NAMES = ("znver", "bdver", "btver", "amdfam", "athlon", "barcelona")


def _host_cpu_vendor() -> str:
    import llvmlite.binding as ll
    from numba import config
    cpu = getattr(config, "CPU_NAME", None)   # NUMBA_CPU_NAME, when set
    if not cpu or cpu == "host":
        cpu = ll.get_host_cpu_name()
    return "amd" if cpu.startswith(_AMD_CPU_NAMES) else "intel"


#: Whose cores numba compiles the kernels for, from the CPU name LLVM tunes for
#: (``znver4``, ``emeraldrapids``...): ``"amd"`` or ``"intel"`` (any name not AMD's). With
#: the same instruction set the two differ in what wins (AMD's Zen 4 runs a 512-bit
#: instruction as two 256-bit halves), so the measured crossovers are per (instruction set,
#: vendor): :data:`softmaxkit.kernels.dispatch.WINS_BY_CPU`.
CPU_VENDOR = _host_cpu_vendor()
#: The widest vector instruction set numba compiles the kernels for: ``"avx512"``,
#: ``"avx2"`` (with FMA) or ``"other"``. Which kernel beats aten depends on it
#: (:data:`softmaxkit.kernels.dispatch.NUMBA_WINS`).
VECTOR_ISA = _host_vector_isa()
#: Whether :func:`wide_vectors` asks for 512-bit vectors (the CPU numba compiles for has AVX-512).
WIDE_VECTORS = VECTOR_ISA == "avx512"


@intrinsic
def wide_vectors(typingctx):
    """Let LLVM vectorise the enclosing function with 512-bit registers where the CPU has them.

    LLVM's tuning for Intel's AVX-512 server cores prefers 256-bit vectors
    (``prefer-256-bit``), so numba's loops use ``ymm`` registers even there; on the
    elementwise loops of the kernels (an ``exp`` per score) ``zmm`` registers measured about
    1.4x faster on a Xeon of the Emerald Rapids generation. The function attributes set here
    (``prefer-vector-width``, ``min-legal-vector-width``, as clang's
    ``-mprefer-vector-width=512``) apply to the LLVM function being lowered: call it in the
    body of a ``prange`` loop (numba outlines that body into its own function) or at the top
    of a serial kernel. It emits no instruction; without AVX-512 it does nothing.
    """
    def codegen(context, builder, signature, args):
        if WIDE_VECTORS:
            attributes = builder.function.attributes
            # llvmlite's attribute set admits only its known names; these are key-value
            # attributes, written to the IR as given
            set.add(attributes, '"prefer-vector-width"="512"')
            set.add(attributes, '"min-legal-vector-width"="512"')
        return context.get_dummy_value()
    return types.none(), codegen



@intrinsic
def divide_finite(typingctx, a, b):
    """``a / b`` for finite ``a`` and finite, non-zero ``b`` (the caller guarantees it).

    Emitted as LLVM's ``fdiv fast``: in float32 the x86 backend then multiplies by a
    reciprocal estimate (``rcp14``) refined by one Newton step, within about 1 ulp of the
    correctly rounded quotient (a vector division costs about ten multiply-adds; the
    one-pass attention row kernels divide once per score for sigmoid and softplus). An
    infinite or zero operand gives an unspecified result.
    """
    if a != b or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1], flags=("fast",))
    return a(a, b), codegen


@intrinsic
def is_nan(typingctx, x):
    """Whether ``x`` is NaN, tested on its bits (exponent all ones, mantissa not zero).

    Kernels compiled with ``nnan`` (which lets LLVM vectorise max reductions) may fold any
    floating-point NaN test to False (numba puts the kernel's fast-math flags on every
    ``fcmp``, this one's too), and a select on a computed value may then pick either side.
    An integer test on the bits of a value loaded from memory (a raw score) cannot be folded,
    so a kernel can route rows holding a NaN to code that propagates it as the reference does.
    """
    if not isinstance(x, types.Float):
        return None
    width = 32 if x == types.float32 else 64
    magnitude = (1 << (width - 1)) - 1
    infinity = 0x7F800000 if width == 32 else 0x7FF0000000000000

    def codegen(context, builder, signature, args):
        kind = ir.IntType(width)
        bits = builder.and_(builder.bitcast(args[0], kind), ir.Constant(kind, magnitude))
        return builder.icmp_unsigned(">", bits, ir.Constant(kind, infinity))
    return types.boolean(x), codegen


@intrinsic
def pointer_to(typingctx, address, like):
    """``address`` (an integer, a tensor's ``data_ptr()``) as a pointer to values of
    ``like``'s type, for ``numba.carray``: a kernel that takes addresses instead of arrays
    skips the conversion of each tensor to a numpy array (about 1.6 us) and the unboxing
    of each array on the call."""
    pointer_type = types.CPointer(like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer_type))
    return pointer_type(types.intp, like), codegen
