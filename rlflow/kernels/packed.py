"""``Packed``: a struct of arrays (a NamedTuple) as one argument of a compiled call.

A compiled call unboxes a NamedTuple's arrays one by one on every call (about 0.4 us each); a ``Packed`` is
unboxed at once. The kernels that run on every env step or every insert take their structs packed
(:func:`pack`) and read them as ``packed.value``.
"""

from __future__ import annotations

from typing import Any

from numba import njit, types
from numba.experimental import structref

__all__ = ["Packed", "pack"]


@structref.register
class _PackedType(types.StructRef):
    def preprocess_fields(self, fields: Any) -> Any:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class Packed(structref.StructRefProxy):
    """One struct of arrays (a NamedTuple) as one argument: a compiled call types and unboxes a
    ``Packed`` at once, where it would take a NamedTuple's arrays one by one on every call. Made by
    :func:`pack`; its struct is ``.value`` inside the kernels."""

    value: Any  # the struct (an attribute numba's proxy defines)


structref.define_proxy(Packed, _PackedType, ["value"])


@njit(cache=True)
def pack(value: Any) -> Packed:
    """``value`` (a NamedTuple of arrays) as a :class:`Packed` (made by a cached compiled call: the proxy's own
    constructor would compile in every process)."""
    return Packed(value)
