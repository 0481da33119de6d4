"""``prefetch(array, index)``: ask the CPU to start loading the cache line of element ``index`` of
``array``'s flat buffer (C order), from numba code.

The batched kernels (sum-tree descents and updates, item draws) touch one random cache line per element
of a batch. Issuing the loads of a whole batch level before using any of them lets their memory
latencies overlap: on the replay benchmark's million-leaf tree a descent of 256 targets took half the
time with it. A prefetch is only a hint: it never faults (not even for an address outside the array) and never
changes a result.

``prefetch_write`` is the same for a line about to be written. Where this llvmlite cannot emit LLVM's
prefetch intrinsic, both are no-ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["AHEAD", "copy_bytes", "prefetch", "prefetch_write"]

# How many elements ahead a kernel walking scattered slots or rows one by one requests their lines: enough
# misses in flight to overlap, few enough to be used before they are evicted.
AHEAD = 16


def _intrinsic(write: int) -> Any:
    @intrinsic
    def llvm_prefetch(typingctx: Any, array: Any, index: Any) -> Any:
        from llvmlite import ir

        sig = types.void(array, index)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(arr.data, [args[1]])  # element ``index`` of the flat (C-ordered) buffer
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(write), i32(3), i32(1)])  # keep in all levels; data
            return context.get_dummy_value()

        return sig, codegen

    return llvm_prefetch


_llvm_prefetch = _intrinsic(0)
_llvm_prefetch_write = _intrinsic(1)


@njit(inline="always")
def _no_prefetch(array: np.ndarray, index: int) -> None:
    pass


@njit(cache=True)
def _touch(a: np.ndarray) -> float:
    _llvm_prefetch(a, 1)
    return a[0]


@njit(cache=True)
def _touch_write(a: np.ndarray) -> float:
    _llvm_prefetch_write(a, 1)
    return a[0]


def _probe(touch: Any, hint: Any) -> Any:
    """``hint`` if a function using it compiles and runs here (cached on disk after the first time)."""
    try:
        touch(np.zeros(2))
    except Exception:  # an llvmlite without the typed-pointer intrinsic: prefetching is only an optimisation
        return _no_prefetch
    return hint


prefetch = _probe(_touch, _llvm_prefetch)
prefetch_write = _probe(_touch_write, _llvm_prefetch_write)


@intrinsic
def copy_bytes(typingctx: Any, dst: Any, i: Any, src: Any, j: Any, n: Any) -> Any:
    """Copy ``n`` bytes from flat element ``j`` of ``src`` to flat element ``i`` of ``dst`` (C-contiguous uint8
    arrays, the ranges inside them and apart) as one ``llvm.memcpy``: a row of a few dozen bytes costs a few
    wide moves instead of a byte loop."""
    if not all(isinstance(a, types.Array) and a.layout == "C" and a.dtype == types.uint8 for a in (dst, src)):
        return None
    sig = types.void(dst, i, src, j, n)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(d.data, [args[1]]), builder.gep(s.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()

    return sig, codegen
