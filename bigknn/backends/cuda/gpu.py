"""One CUDA backend's GPU as its GNND, GGM and exact k-NN functions see it."""

from __future__ import annotations

import threading

from bigknn.core import envvars
from bigknn.backends.cuda import memory
from bigknn.backends.cuda.resident import ResidentCopies
from bigknn.backends.cuda.transfer import Transfer


class Gpu:
    """The device, its memory cap, the copies kept between calls and the copier that uses them, the
    options of the calls, what the last merge needed and the last call's statistics."""

    def __init__(self, gpu_mem_bytes: int | None = None, device: int | None = None, profile: bool = False,
                 l2_expand: bool | None = None, tensor_cores: bool | None = None):
        self.gpu_mem_bytes = gpu_mem_bytes
        self.device = device
        self.profile = profile  # time each kernel with events (last_stats["kernel_ms"]); a search: rows, hops
        # l2 cross-match distances by |a|^2 + |b|^2 - 2 a.b (exact keys restored at the end); None: env
        # BIGKNN_CUDA_EXPAND, default on
        self.l2_expand = l2_expand
        # half-precision cross-match tiles on tensor cores; None: env BIGKNN_CUDA_MMA, default on
        self.tensor_cores = tensor_cores
        self.resident = ResidentCopies()  # device copies kept between calls (resident.py)
        self.transfer = Transfer(self.resident)
        self.last_need = 0  # device bytes of the call planned last: what uploads ahead must leave free
        self.plan_lock = threading.Lock()  # a call's plan (memory.plan_slots) against the uploads ahead
        self.last_stats: dict = {}

    def context(self):
        """This GPU as a context (the current one when no device was given)."""
        import cupy as cp

        return cp.cuda.Device(self.device) if self.device is not None else cp.cuda.Device()

    def budget(self) -> int:
        """Device bytes one call may plan to use (memory.budget)."""
        return memory.budget(self.gpu_mem_bytes, self.resident)

    def use_l2_expand(self) -> bool:
        """Whether l2 cross-match distances use the norm expansion."""
        if self.l2_expand is not None:
            return bool(self.l2_expand)
        return envvars.flag("BIGKNN_CUDA_EXPAND", True)

    def use_tensor_cores(self) -> bool:
        """Whether cross-match tiles may run on tensor cores (compile.uses_mma says where they do)."""
        if self.tensor_cores is not None:
            return bool(self.tensor_cores)
        return envvars.flag("BIGKNN_CUDA_MMA", True)
