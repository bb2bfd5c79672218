"""Sizes and durations in the units people read: "896 GB", "5.4 h", "4.0 years"."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """Decimal units, as disks are sold: 896 GB, 1.2 TB, 512 MB.

    >>> human_bytes(896e9), human_bytes(1_234_567_890_123), human_bytes(999)
    ('896 GB', '1.2 TB', '999 B')
    """
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


def human_duration(seconds: float) -> str:
    """The largest unit that keeps the number readable.

    >>> human_duration(4.25), human_duration(42), human_duration(210), human_duration(19440)
    ('4.2 s', '42 s', '3.5 min', '5.4 h')
    >>> human_duration(3 * 86400), human_duration(4 * 365 * 86400)
    ('3.0 days', '4.0 years')
    """
    for unit, size, least in (("years", 365 * 86400, 2), ("days", 86400, 2), ("h", 3600, 1), ("min", 60, 1)):
        if seconds >= size * least:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
