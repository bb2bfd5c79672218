"""What a run did, for its summary and the manifest's timings: seconds per phase (summed over workers), bytes
moved, each worker's busy time, each phase's wall-clock span, and how recall-targeted descents ended."""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class Accounting:
    """What a run did: seconds per phase (summed over workers), bytes moved, each worker's busy time, and
    the wall-clock span of each phase."""

    seconds: dict = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    busy: dict = field(default_factory=dict)  # worker name -> seconds inside backend calls
    timeline: list = field(default_factory=list)  # each backend call (add_task), seconds since t0
    spans: dict = field(default_factory=dict)  # phase -> [start, end] seconds since t0
    descents: dict = field(default_factory=dict)  # "gnnd" / "ggm" -> how recall-targeted descents ended
    t0: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, seconds: float, nbytes_read: int = 0, nbytes_written: int = 0) -> None:
        with self.lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
            self.bytes_read += nbytes_read
            self.bytes_written += nbytes_written

    def add_written(self, nbytes: int) -> None:
        """Bytes written outside any timed phase (the manifest's commits)."""
        with self.lock:
            self.bytes_written += nbytes

    def add_descent(self, phase: str, report: dict | None) -> None:
        """Count a descent's iterations, widenings and how it ended (bigknn/algorithms/recall_target.py Stopper.report)."""
        if report is None:
            return
        with self.lock:
            d = self.descents.setdefault(phase, {"count": 0, "iterations": 0, "widened": 0, "stops": {}})
            d["count"] += 1
            d["iterations"] += len(report["trace"])
            d["widened"] += report["widened"]
            reason = report["stop"].split(":")[0]
            d["stops"][reason] = d["stops"].get(reason, 0) + 1

    def add_task(self, worker: str, phase: str, start: float, end: float, report: dict | None = None,
                 nbytes_read: int = 0, stages: dict | None = None) -> None:
        """Book a backend call (perf_counter times) and how its descent ended (``report``): the phase's seconds
        and span, the worker's busy time, the descent's counts, and the call's line in the timeline: where a
        worker waited, and how much of a call its iterations took (``descent_s``), which busy_frac alone
        does not say; ``stages``: the backend's seconds per stage of the call (Backend.last_stats: compile,
        copies, iterations; ``gpus`` where one call spanned several), and the recall sample's exact search
        (``sample_s``)."""
        self.add(phase, end - start, nbytes_read)
        self.extend_span(phase, start, end)
        self.add_descent(phase, report)
        line = {"worker": worker, "phase": phase, "start": round(start - self.t0, 3), "end": round(end - self.t0, 3)}
        if report is not None:
            line.update(iterations=len(report["trace"]), widened=report["widened"], descent_s=report["spent_s"],
                        stop=report["stop"], estimate=report["estimate"])
        line.update({key: round(value, 3) if isinstance(value, float) else value
                     for key, value in (stages or {}).items()
                     if (key.endswith("_s") and isinstance(value, float)) or key.endswith("_kept") or key == "gpus"})
        with self.lock:
            self.busy[worker] = self.busy.get(worker, 0.0) + end - start
            self.timeline.append(line)

    def extend_span(self, phase: str, start: float, end: float) -> None:
        """Widen ``phase``'s span to cover [start, end] (perf_counter times; phases of tasks interleave)."""
        with self.lock:
            lo, hi = self.spans.get(phase, [math.inf, -math.inf])
            self.spans[phase] = [round(min(lo, start - self.t0), 3), round(max(hi, end - self.t0), 3)]

    def short_of(self, target: float) -> list[dict]:
        """The timeline's calls whose descent ended with its estimate's mean below ``target`` (stalled where
        its lists could grow no wider, or out of iterations), lowest first."""
        with self.lock:
            short = [t for t in self.timeline if t.get("estimate") and t["estimate"]["recall"] < target]
        return sorted(short, key=lambda t: t["estimate"]["recall"])

    def summary(self) -> dict:
        """The parts of a run's report every writing command gives: seconds and wall-clock span per phase, each
        backend call (sorted by worker, then start) and how the recall-targeted descents ended."""
        return {"phase_s": {p: round(s, 3) for p, s in self.seconds.items()}, "phase_wall_s": self.spans,
                "timeline": sorted(self.timeline, key=lambda t: (t["worker"], t["start"])),
                "descents": self.descents}

    @contextmanager
    def span(self, phase: str) -> Iterator[None]:
        start = time.perf_counter() - self.t0
        try:
            yield
        finally:
            self.spans[phase] = [round(start, 3), round(time.perf_counter() - self.t0, 3)]
