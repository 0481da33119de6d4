"""``prefetch(array, index)``: ask the CPU to start loading the cache line of element ``index`` of
``array``'s flat buffer (C order), from numba code.

The batched kernels (sum-tree descents and updates, item draws) touch one random cache line per element
of a batch. Issuing the loads of a whole batch level before using any of them lets their memory
latencies overlap: on the replay benchmark's million-leaf tree a descent of 256 targets took half the
time with it. A prefetch is only a hint: it never faults (not even for an address outside the array) and never
changes a result.

``prefetch_write`` is the same for a line about to be written. Both emit LLVM's ``llvm.prefetch`` intrinsic,
named by llvmlite for its pointer model (typed ``p0i8`` or opaque ``p0``); where this llvmlite's LLVM does
not take it (:func:`prefetch_available`, asked once when the first kernel using a prefetch is compiled, on
a one-function module: no numba compile), both emit nothing. Importing this module compiles nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["AHEAD", "copy_bytes", "prefetch", "prefetch_available", "prefetch_write"]

# How many elements ahead a kernel walking scattered slots or rows one by one requests their lines: enough
# misses in flight to overlap, few enough to be used before they are evicted.
AHEAD = 16

_available: bool | None = None


def _emit(builder: Any, address: Any, write: int) -> None:
    """A call of ``llvm.prefetch`` on ``address`` (an ``i8*``): keep in all cache levels, a data line."""
    from llvmlite import ir

    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
    builder.call(fn, [address, i32(write), i32(3), i32(1)])


def prefetch_available() -> bool:
    """Whether this llvmlite's LLVM takes the prefetch call :func:`prefetch` emits: a one-function module
    calling it is parsed and verified by LLVM once per process (no numba compile); False means that
    :func:`prefetch` and :func:`prefetch_write` emit nothing (prefetching is only an optimisation)."""
    global _available
    if _available is None:
        from llvmlite import binding, ir

        try:
            module = ir.Module()
            fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()]), "probe")
            builder = ir.IRBuilder(fn.append_basic_block())
            _emit(builder, fn.args[0], 0)
            builder.ret_void()
            binding.parse_assembly(str(module)).verify()
            _available = True
        except Exception:  # an llvmlite whose LLVM rejects the call: kernels compile without prefetches
            _available = False
    return _available


def _intrinsic(write: int) -> Any:
    @intrinsic
    def llvm_prefetch(typingctx: Any, array: Any, index: Any) -> Any:
        sig = types.void(array, index)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            if prefetch_available():
                from llvmlite import ir

                arr = context.make_array(signature.args[0])(context, builder, args[0])
                ptr = builder.gep(arr.data, [args[1]])  # element ``index`` of the flat (C-ordered) buffer
                _emit(builder, builder.bitcast(ptr, ir.IntType(8).as_pointer()), write)
            return context.get_dummy_value()

        return sig, codegen

    return llvm_prefetch


prefetch = _intrinsic(0)
prefetch_write = _intrinsic(1)


def _copy_bytes(typingctx: Any, dst: Any, i: Any, src: Any, j: Any, n: Any) -> Any:
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


# Called from kernels without the typing context, which numba's stubs count as the first argument.
copy_bytes = cast(Callable[[np.ndarray, int, np.ndarray, int, int], None], intrinsic(_copy_bytes))
