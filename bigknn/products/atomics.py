"""Atomic updates of int64 arrays inside numba-compiled loops that several threads run at once (numba has none
for the CPU): compare-and-swap for the union-find's links, fetch-and-add for parallel counting and scattering."""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _pointer(context, builder, array_type, array, index):
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, [index], wraparound=False)


@intrinsic
def cas(typingctx, array, index, expected, new):
    """Atomically: old = array[index]; if old == expected: array[index] = new. Returns old (int64 arrays)."""
    if not (isinstance(array, types.Array) and array.dtype == types.int64):
        return None
    sig = types.int64(array, index, expected, new)

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        want = context.cast(builder, args[2], signature.args[2], types.int64)
        value = context.cast(builder, args[3], signature.args[3], types.int64)
        swapped = builder.cmpxchg(ptr, want, value, "seq_cst", "seq_cst")
        return builder.extract_value(swapped, 0)

    return sig, codegen


@intrinsic
def fetch_add(typingctx, array, index, value):
    """Atomically: old = array[index]; array[index] = old + value. Returns old (int64 arrays)."""
    if not (isinstance(array, types.Array) and array.dtype == types.int64):
        return None
    sig = types.int64(array, index, value)

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        add = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, add, "monotonic")

    return sig, codegen
