"""scripts/families.py: every synthetic family at 2K rows (shape, dtype, seed determinism, the promised
properties), and the text family on a few passages when its model folder and torch are here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from bigknn.formats import open_vectors
from bigknn.core.synth import BLOCK_ROWS, synth

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
families = importlib.import_module("families")

SHAPES = {"synth": (96, np.float32), "iid64": (64, np.float32), "iid128": (128, np.float32),
          "u8": (128, np.uint8), "f16": (768, np.float16)}


def _make(tmp_path: Path, family: str, rows: int = 2000, seed: int = 0, threads: int | None = None,
          name: str = "a") -> tuple[np.ndarray, dict]:
    out = tmp_path / f"{name}{families.EXT[family]}"
    rec = families.write_family(family, out, rows, seed, threads)
    return np.asarray(open_vectors(out).data), rec


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_synthetic_family_shape_dtype_and_seed(tmp_path: Path, family: str) -> None:
    x, rec = _make(tmp_path, family, seed=5)
    dim, dtype = SHAPES[family]
    assert x.shape == (2000, dim) and x.dtype == dtype
    assert (rec["rows"], rec["dim"], rec["dtype"], rec["metric"]) == (2000, dim, np.dtype(dtype).name, "l2")
    assert np.isfinite(x.astype(np.float32)).all() and len(np.unique(x, axis=0)) == len(x)
    same, _ = _make(tmp_path, family, seed=5, name="b")
    other, _ = _make(tmp_path, family, seed=6, name="c")
    assert np.array_equal(x, same) and not np.array_equal(x, other)


def test_synth_family_is_bigknn_synth(tmp_path: Path) -> None:
    x, _ = _make(tmp_path, "synth", seed=3)
    assert np.array_equal(x, synth(2000, 96, seed=3))


def test_blocks_do_not_depend_on_threads(tmp_path: Path) -> None:
    rows = 2 * BLOCK_ROWS + 7
    one, _ = _make(tmp_path, "iid64", rows, threads=1, name="one")
    three, _ = _make(tmp_path, "iid64", rows, threads=3, name="three")
    assert np.array_equal(one, three) and not np.array_equal(one[:BLOCK_ROWS], one[BLOCK_ROWS:2 * BLOCK_ROWS])


def test_u8_is_sift_like(tmp_path: Path) -> None:
    x, _ = _make(tmp_path, "u8")
    zeros = np.mean(x == 0)
    assert 0.3 < zeros < 0.7 and x.max() > 100 and (x.max(axis=1) > 0).all()
    norms = np.linalg.norm(x.astype(np.float32), axis=1)
    assert np.allclose(norms, 512, rtol=0.02)  # SIFT-normalised before rounding


def test_wrong_extension_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="u8bin"):
        families.write_family("u8", tmp_path / "x.fbin", 10, 0)


@pytest.mark.slow  # importing torch + sentence-transformers and loading the model: 15-40 s on 2 cores
def test_text_family_on_a_few_passages(tmp_path: Path) -> None:
    text_family = importlib.import_module("text_family")
    if not (text_family.MODEL_DIR / "model.safetensors").exists():
        pytest.skip(f"text family: no model folder {text_family.MODEL_DIR} (run scripts/package_model.sh)")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("text family: torch and sentence-transformers are not installed here")
    roots = [str(Path(families.__file__).resolve().parent.parent / "bigknn")]
    texts, found = text_family.passages(48, seed=1, roots=roots, workers=1)
    again, found_again = text_family.passages(48, seed=1, roots=roots, workers=2)
    assert len(texts) == 48 and texts == again and found == found_again
    assert all(text_family.MIN_CHARS <= len(p) <= text_family.MAX_CHARS for p in texts)
    out = tmp_path / "t.fbin"
    rec = families.write_family("text", out, 48, 1, 1, text_roots=roots)
    x = np.asarray(open_vectors(out).data)
    assert x.shape == (48, 384) and x.dtype == np.float32 and rec["metric"] == "cosine"
    assert np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
    assert rec["provenance"]["passages_sha256"] == found["passages_sha256"]


def test_sift_family_is_real_dense_sift(monkeypatch: pytest.MonkeyPatch) -> None:
    image_family = importlib.import_module("image_family")
    if importlib.util.find_spec("cv2") is None:
        pytest.skip("sift family: OpenCV (opencv-python-headless) is not installed here")
    monkeypatch.setattr(image_family, "PHOTOS", {"skimage": ["data/camera.png", "data/coins.png"]})
    monkeypatch.setattr(image_family, "SCALES", (0.5,))
    if len(image_family.photo_paths()) < 2:
        pytest.skip("sift family: scikit-image's sample photographs are not installed here")
    x, prov = image_family.descriptors(500, seed=1, workers=1)
    again, prov_again = image_family.descriptors(500, seed=1, workers=2)
    other, _ = image_family.descriptors(500, seed=2, workers=1)
    assert x.shape == (500, 128) and x.dtype == np.uint8 and np.array_equal(x, again) and prov == prov_again
    assert not np.array_equal(x, other) and len(np.unique(x, axis=0)) == len(x)
    assert (x.sum(axis=1) >= image_family.MIN_SUM).all() and x.max() > 100
    assert prov["photos"] == ["skimage/data/camera.png", "skimage/data/coins.png"]
    assert prov["descriptors_distinct"] <= prov["descriptors_found"] == sum(prov["per_photo"])
