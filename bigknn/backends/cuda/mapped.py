"""A host array the device reads in place: pinned and mapped into the device's address space for the length of
a call (zero-copy). A kernel's loads of it cross PCIe as it makes them, so a gather of scattered rows moves
only those rows, without the host gathering them first (issue 15: a capped 10M prune gathered ~250 GB of
candidate rows on the host and did not finish in 290 s)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np

REGISTER_PORTABLE_MAPPED = 0x01 | 0x02  # cudaHostRegisterPortable | cudaHostRegisterMapped


@contextmanager
def mapped(host: np.ndarray) -> Iterator:
    """A CuPy array over ``host``'s memory (C-contiguous), valid inside the ``with``; pinning costs about
    what one copy of the array would (~0.1-0.3 s per GB)."""
    import cupy as cp

    if not host.flags.c_contiguous:
        raise ValueError("mapped() needs a C-contiguous host array")
    if host.nbytes == 0:
        yield cp.empty(host.shape, host.dtype)
        return
    ptr = host.ctypes.data
    cp.cuda.runtime.hostRegister(ptr, host.nbytes, REGISTER_PORTABLE_MAPPED)
    try:
        device_ptr = cp.cuda.runtime.pointerGetAttributes(ptr).devicePointer
        memory = cp.cuda.UnownedMemory(device_ptr, host.nbytes, host)
        yield cp.ndarray(host.shape, host.dtype, cp.cuda.MemoryPointer(memory, 0))
    finally:
        cp.cuda.runtime.deviceSynchronize()  # no kernel may still read it
        cp.cuda.runtime.hostUnregister(ptr)
