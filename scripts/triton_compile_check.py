"""Compile the fused attention templates for a CUDA target without a GPU.

The interpreter (``TRITON_INTERPRET=1``) runs the kernels as Python; this compiles them
to PTX and cubin for ``sm_90`` (H100/H200) with Triton's own compiler and ptxas, which
catches what only the compiler rejects (types of values carried through loops and
branches, constexpr misuse) and reports the shared memory each configuration needs.

    python scripts/triton_compile_check.py                 # every template, bf16 and float32
    python scripts/triton_compile_check.py softpick:_fwd:bf16:1 sparsemax:_fwd_threshold:bf16:0

Each item is ``normalizer:kernel:dtype:mask_kind[:head_dim]`` (mask kind 0 none, 1 bool,
2 additive; head dim padded to a power of two, 128 by default).
Exit status 1 when a compile fails. Needs ``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import inspect
import os
import sys
import time

DEFAULT = [
    "softmax:_fwd:bf16:1", "softmax:_bwd_kv:bf16:1", "softmax:_bwd_q:bf16:2", "softmax:_fwd:fp32:0",
    "softpick:_fwd:bf16:0", "softpick:_bwd_kv:bf16:0", "softpick:_bwd_q:bf16:0",
    "relu_l1:_fwd:fp16:1", "relu_l1:_bwd_q:fp16:1", "sigmoid:_fwd:bf16:0", "sigmoid:_bwd_kv:bf16:0",
    "multimax:_bwd_q:bf16:0", "sparsemax:_fwd_threshold:bf16:1", "sparsemax:_bwd_q:bf16:1",
    "entmax:_fwd_threshold:bf16:0", "as_entmax:_bwd_q:fp32:0", "softmax:_fwd:bf16:0:256", "ssmax:_bwd_q:bf16:0:256",
]


def compile_one(item: str) -> tuple[bool, str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import softmaxkit as sk
    from softmaxkit.attention.fused_triton import FAMILY_CODES, pieces_of
    from softmaxkit.forms import SumNormalized
    from softmaxkit.kernels.gpu import _attention_kernels as kernels

    name, kernel, dtype, mask_kind, *head = item.split(":")
    block_d = int(head[0]) if head else 128
    mask_kind_i = int(mask_kind)
    spec = sk.registry.get(name)
    pieces = pieces_of(spec)
    family = 2 if isinstance(spec.form, SumNormalized) and spec.form.signed else FAMILY_CODES[spec.family]
    n_par = len(pieces.values(spec.with_defaults({})))
    fn = kernels.__dict__[kernel]
    mask_ptr = "i1" if mask_kind_i == 1 else "fp32"
    pointers = {"Q": dtype, "K": dtype, "V": dtype, "O": dtype, "DO": dtype, "MASK": mask_ptr, "QDOC": "i32",
                "KDOC": "i32"}
    constants = {
        "FN": pieces.fn, "DFN": pieces.dfn, "DPFN": pieces.dpar or pieces.dfn, "FAMILY": family, "ALPHA_KIND": 0,
        "MAX_ITER": 30, "HAS_CNT": False, "CAUSAL": True, "MASK_KIND": mask_kind_i, "DOCS": True,
        "P_LOWP": dtype != "fp32", "SKIP": True, "PGRAD": n_par > 0, "ROW_DELTA": family in (1, 2),
        "BLOCK_P": max(1, 1 << max(n_par - 1, 0).bit_length()),
        "BLOCK_M": 64 if (kernel != "_fwd" or dtype == "fp32" or block_d > 128) else 128,
        "BLOCK_N": 32 if block_d > 128 else 64, "BLOCK_D": block_d, "BLOCK_DV": block_d,
        "DOT_PREC": "ieee" if dtype == "fp32" else "tf32", "UPCAST": False, "NP": n_par,
    }
    names = list(inspect.signature(fn.fn).parameters)
    signature, constexprs = {}, {}
    for i, param in enumerate(names):
        if param in constants and (param != "NP" or kernel == "_bwd_q"):
            signature[param] = "constexpr"
            constexprs[(i,)] = constants[param]
        elif param.isupper() and param not in ("H", "G", "D", "DV", "NP"):
            signature[param] = "*" + pointers.get(param, "fp32")
        elif param in ("scale", "eps", "u", "tol"):
            signature[param] = "fp32"
        else:
            signature[param] = "i32"
    start = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 8, "num_stages": 1 if block_d > 128 else 2})
    except Exception as err:  # report every failure, then exit 1
        return False, f"{item}: FAILED {type(err).__name__}: {str(err)[:400]}"
    return True, (f"{item}: ok in {time.perf_counter() - start:.1f} s, shared memory "
                  f"{compiled.metadata.shared / 1024:.0f} KiB")


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: this compiles the kernels", file=sys.stderr)
        return 2
    ok = True
    for item in argv or DEFAULT:
        good, line = compile_one(item)
        ok &= good
        print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
