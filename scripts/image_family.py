"""The `sift` benchmark family: real SIFT descriptors (128-d uint8, l2, as SIFT1M holds them) of photographs
that Python packages install with themselves (scikit-image's, scikit-learn's and matplotlib's sample photos).

Descriptors: OpenCV's SIFT (rounded to uint8 as its CV_8U descriptors are), computed upright at a dense grid of keypoints (every STEP pixels,
patch sizes SIZES) on each photograph in grey at SCALES of its size, as dense-SIFT image retrieval does; flat
patches (descriptors whose sum is under MIN_SUM: mostly zero) and exact duplicates dropped, then a seeded shuffle.
The same images and OpenCV give the same rows. opencv-python(-headless) is needed here, never by bigknn.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# the photographs (not drawings, plots or test patterns) each package installs, relative to its folder
PHOTOS = {
    "skimage": ["data/astronaut.png", "data/brick.png", "data/camera.png", "data/cell.png", "data/chelsea.png",
                "data/clock_motion.png", "data/coffee.png", "data/coins.png", "data/grass.png", "data/gravel.png",
                "data/ihc.png", "data/moon.png", "data/motorcycle_left.png", "data/motorcycle_right.png",
                "data/page.png", "data/rocket.jpg", "data/text.png"],
    "sklearn": ["datasets/images/china.jpg", "datasets/images/flower.jpg"],
    "matplotlib": ["mpl-data/sample_data/grace_hopper.jpg"],
}
STEP = 4  # pixels between keypoints
SIZES = (8.0, 16.0, 24.0)  # keypoint diameters (SIFT's patch is about this wide)
SCALES = (1.0, 0.75, 0.5)  # image sizes the grid is laid on
MIN_SUM = 64  # a descriptor summing to less is a flat patch's (OpenCV leaves it near zero)


def photo_paths() -> dict[str, str]:
    """package/name -> path of the photographs of PHOTOS installed here, in a fixed order (packages found
    without importing them)."""
    found = {}
    for package, names in PHOTOS.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        found.update({f"{package}/{name}": str(root / name) for name in names if (root / name).is_file()})
    return found


def image_descriptors(path: str) -> np.ndarray:
    """Dense upright SIFT descriptors of one photograph at every scale, (rows, 128) uint8, flat ones dropped."""
    import cv2

    grey = cv2.imread(path, cv2.IMREAD_GRAYSCALE)
    if grey is None:
        return np.empty((0, 128), np.uint8)
    sift = cv2.SIFT_create()
    out = []
    for scale in SCALES:
        img = grey if scale == 1.0 else cv2.resize(grey, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        h, w = img.shape
        margin = int(max(SIZES))
        points = [cv2.KeyPoint(float(x), float(y), size, 0.0)
                  for size in SIZES for y in range(margin, h - margin, STEP) for x in range(margin, w - margin, STEP)]
        if points:
            _, desc = sift.compute(img, points)
            if desc is not None:
                out.append(np.clip(np.rint(desc), 0, 255).astype(np.uint8))  # as OpenCV's uint8 descriptors
    if not out:
        return np.empty((0, 128), np.uint8)
    desc = np.concatenate(out)
    return desc[desc.sum(axis=1, dtype=np.int64) >= MIN_SUM]


def descriptors(rows: int, seed: int, workers: int | None = None) -> tuple[np.ndarray, dict]:
    """``rows`` distinct descriptors (fewer if the photographs give fewer), seeded order, and their provenance."""
    import cv2

    paths = photo_paths()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(min(workers or os.cpu_count() or 1, max(1, len(paths)))) as pool:
        parts = list(pool.map(image_descriptors, paths.values()))
    found = sum(len(p) for p in parts)
    every = np.unique(np.concatenate(parts) if parts else np.empty((0, 128), np.uint8), axis=0)
    order = np.random.default_rng([seed, 11]).permutation(len(every))[:rows]
    chosen = np.ascontiguousarray(every[order])
    print(f"sift: {found} descriptors of {len(paths)} photographs, {len(every)} distinct, in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return chosen, {"photos": list(paths),
                    "photo_sha256": hashlib.sha256(b"".join(Path(p).read_bytes() for p in paths.values())).hexdigest(),
                    "per_photo": [len(p) for p in parts], "descriptors_found": found,
                    "descriptors_distinct": len(every), "opencv": cv2.__version__,
                    "grid": {"step": STEP, "sizes": SIZES, "scales": SCALES, "min_sum": MIN_SUM}}
