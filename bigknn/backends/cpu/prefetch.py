"""Software prefetch for the compiled kernels: ask for a list's sample rows while the previous list computes.

A cross-match reads ~60 random rows per list (90 KB at d = 384) that are mostly not in any cache, and the
hardware prefetcher cannot guess the next random row: on text 100K x 384 the same kernel ran 1.8x faster
when the rows were made cache-resident (docs/perf-notes.md, 2026-11-26). numba has no prefetch, so this is
LLVM's ``llvm.prefetch`` intrinsic, emitted as one prefetch instruction per call.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

LINE_BYTES = 64  # a cache line
LOCALITY = 2  # llvm.prefetch locality 2: into the core's L2 (prefetcht1), not L1, where the current list works


@intrinsic
def _prefetch(typingctx, arr, row, col):
    """Prefetch the cache line holding arr[row, col] (a 2-d array) for reading; no fault if out of bounds."""

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        index = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:])]
        ptr = cgutils.get_item_pointer2(context, builder, ary.data, cgutils.unpack_tuple(builder, ary.shape),
                                        cgutils.unpack_tuple(builder, ary.strides), aryty.layout, index,
                                        wraparound=False)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, cgutils.voidptr_t), i32(0), i32(LOCALITY), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, row, col), codegen


@njit(cache=True, inline="always")
def prefetch_rows(x, ids, empty):
    """Prefetch every cache line of the rows of ``x`` that ``ids`` names (ids equal to ``empty`` skipped)."""
    step = max(1, LINE_BYTES // x.itemsize)  # items per line: float32 vectors, int8 split rows, lists
    for t in range(ids.size):
        r = ids[t]
        if r != empty:
            for j in range(0, x.shape[1], step):
                _prefetch(x, r, j)
            _prefetch(x, r, x.shape[1] - 1)  # the row's last line, where rows do not start on a line
