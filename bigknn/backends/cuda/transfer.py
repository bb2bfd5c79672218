"""Host <-> device copies of one CUDA backend, staged through pinned buffers.

Large arrays move in 32 MiB chunks through three pinned buffers that 8 threads fill (NumPy drops the GIL
while copying), so the host copy of one chunk overlaps the PCIe copy of the previous one. The buffers live
as long as the backend (one set for the calls, one for the upload-ahead thread). Arrays that have a copy
kept between calls (resident.py) are taken from it instead of uploaded.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bigknn.backends.cuda.resident import ResidentCopies
from bigknn.core.hostmem import filled_once


class Transfer:
    CHUNK = 32 << 20
    NSTAGE = 3
    THREADS = 8

    def __init__(self, resident: ResidentCopies):
        self.resident = resident
        self._staging: list | None = None
        self._staging_ahead: list | None = None  # pinned buffers of the upload-ahead thread
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _buffers(self, ahead: bool = False):
        """Pinned staging buffers (kept for the backend's lifetime; one set for the calls, one for the
        upload-ahead thread), made with the copy thread pool on first use."""
        import cupyx

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.THREADS)
            attr = "_staging_ahead" if ahead else "_staging"
            if getattr(self, attr) is None:
                setattr(self, attr, [[cupyx.empty_pinned((self.CHUNK,), dtype=np.uint8), None]
                                     for _ in range(self.NSTAGE)])
            return getattr(self, attr)

    def _pcopy(self, dst: np.ndarray, src: np.ndarray):
        """dst[:] = src for flat uint8 arrays, split over threads (NumPy drops the GIL while copying)."""
        n = src.nbytes
        if n < (4 << 20):
            np.copyto(dst, src)
            return
        step = -(-n // self.THREADS)
        futs = [self._pool.submit(np.copyto, dst[a:a + step], src[a:a + step]) for a in range(0, n, step)]
        for f in futs:
            f.result()

    def h2d(self, src: np.ndarray, dst, stream=None, ahead: bool = False):
        """Copy a contiguous host array into a device array of the same size, queued on ``stream``."""
        import cupy as cp

        src = np.ascontiguousarray(src)
        nbytes = src.nbytes
        if nbytes < (16 << 20):
            dst.set(src, stream=stream)
            return
        stream = stream if stream is not None else cp.cuda.get_current_stream()
        s8 = src.reshape(-1).view(np.uint8)
        d8 = dst.reshape(-1).view(cp.uint8)
        bufs = self._buffers(ahead)
        for i, a in enumerate(range(0, nbytes, self.CHUNK)):
            buf = bufs[i % len(bufs)]
            if buf[1] is not None:
                buf[1].synchronize()
            b = min(a + self.CHUNK, nbytes)
            self._pcopy(buf[0][: b - a], s8[a:b])
            d8[a:b].set(buf[0][: b - a], stream=stream)
            buf[1] = stream.record()

    def d2h(self, src, out: np.ndarray | None = None) -> np.ndarray:
        """Device array -> host array: ``out`` (of src's shape and dtype; e.g. ``touched_later``'s, its pages
        already faulted in) or a new one in huge pages where large (``filled_once``), staged through the pinned
        buffers."""
        import cupy as cp

        src = cp.ascontiguousarray(src)
        if out is None:
            out = filled_once(src.shape, src.dtype)
        elif out.shape != src.shape or out.dtype != src.dtype or not out.flags.c_contiguous:
            raise ValueError(f"d2h: out is {out.shape} {out.dtype}, the device array {src.shape} {src.dtype}")
        nbytes = out.nbytes
        if nbytes < (16 << 20):
            src.get(out=out)
            return out
        stream = cp.cuda.get_current_stream()
        s8 = src.reshape(-1).view(cp.uint8)
        o8 = out.reshape(-1).view(np.uint8)
        bufs = self._buffers()
        chunks = list(range(0, nbytes, self.CHUNK))
        pending = []  # (buffer, a, b) queued, not yet copied out
        for i, a in enumerate(chunks):
            buf = bufs[i % len(bufs)]
            if len(pending) == len(bufs):
                pb, pa, pe = pending.pop(0)
                pb[1].synchronize()
                self._pcopy(o8[pa:pe], pb[0][: pe - pa])
            b = min(a + self.CHUNK, nbytes)
            s8[a:b].get(stream=stream, out=buf[0][: b - a], blocking=False)
            buf[1] = stream.record()
            pending.append((buf, a, b))
        for pb, pa, pe in pending:
            pb[1].synchronize()
            self._pcopy(o8[pa:pe], pb[0][: pe - pa])
        return out

    def to_device(self, host: np.ndarray, dst, stats: dict) -> None:
        """dst[:] = host: from the device copy kept between calls if there is one, else uploaded."""
        import cupy as cp

        dev = self.resident.get(host, cp.cuda.get_current_stream())
        if dev is not None:
            dst[...] = dev.reshape(dst.shape)
            stats["resident_hits"] = stats.get("resident_hits", 0) + 1
        else:
            self.h2d(host, dst)
            stats["h2d_bytes"] = stats.get("h2d_bytes", 0) + host.nbytes

    def device_array(self, host: np.ndarray, stats: dict):
        """``host`` on the device, C-contiguous: the copy kept between calls if there is one (used as it is,
        not copied), else uploaded."""
        import cupy as cp

        dev = self.resident.get(host, cp.cuda.get_current_stream())
        if dev is not None:
            stats["resident_hits"] = stats.get("resident_hits", 0) + 1
            return cp.ascontiguousarray(dev)
        dev = cp.empty(host.shape, dtype=host.dtype)
        self.h2d(host, dev)
        stats["h2d_bytes"] = stats.get("h2d_bytes", 0) + host.nbytes
        return dev
