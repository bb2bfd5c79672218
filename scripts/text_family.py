"""The `text` benchmark family: real sentence embeddings of prose found on the machine itself.

Passages: string literals (docstrings, messages) and comment blocks of Python and C/C++/CUDA sources, and
paragraphs of ``.md``/``.rst``/``.txt`` files, under this Python's stdlib and site-packages, the system's
C and CUDA headers and /usr/share/doc (sorted paths), whitespace-collapsed, kept when they read like prose
(>= 40 chars, >= 6 words, mostly letters), cut at sentence ends when longer than 600 chars, deduplicated
(case- and spacing-blind, as the uncased model sees them), then a seeded shuffle. The same machine image
gives the same passages.
Embedded by the model packaged by ``scripts/package_model.sh`` (all-MiniLM-L6-v2, fp16 on CUDA, float32
on CPU), mean pooled, unit norm. torch and sentence-transformers are needed here, never by bigknn.

The `tokens` family: the same model's contextual token embeddings (its last layer per word piece, before the
pooling; [CLS] and [SEP] left out), unit norm, as late-interaction retrievers (ColBERT) index them: the passages
in the same seeded order until ``rows`` tokens. A set of another shape than the sentences': many rows per
passage, word pieces repeated across contexts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import site
import sys
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np

MODEL_DIR = Path(__file__).resolve().parent.parent / ".model" / "all-MiniLM-L6-v2"
PY_SUFFIXES = (".py", ".pyi", ".pyx", ".pxd")
C_SUFFIXES = (".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu")
DOC_SUFFIXES = (".md", ".rst", ".txt")
SUFFIXES = PY_SUFFIXES + C_SUFFIXES + DOC_SUFFIXES
EXTRA_ROOTS = ("/usr/include", "/usr/local/cuda/include", "/usr/share/doc")
MAX_FILE_BYTES = 2 << 20
MIN_CHARS, MAX_CHARS = 40, 600  # passage length bounds; longer paragraphs are cut at sentence ends
_WORD = re.compile(r"[A-Za-z][a-z]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_PARAGRAPH = re.compile(r"\n\s*\n")
_SPACE = re.compile(r"\s+")
# one left-to-right pass over source code: comments and string literals, the earliest match first
_PY = re.compile(r'(?P<c>#[^\n]*)|"""(?P<s>.*?)"""|' r"'''(?P<t>.*?)'''|"
                 r'"(?P<d>[^"\\\n]*(?:\\.[^"\\\n]*)*)"|' r"'(?P<e>[^'\\\n]*(?:\\.[^'\\\n]*)*)'", re.S)
_C = re.compile(r'(?P<c>//[^\n]*)|/\*(?P<b>.*?)\*/|"(?P<d>[^"\\\n]*(?:\\.[^"\\\n]*)*)"', re.S)
_STARS = re.compile(r"(?m)^\s*\*+ ?")


def text_roots() -> list[str]:
    """This interpreter's stdlib and site-packages folders, the system's C and CUDA headers and package docs
    (those that exist, sorted)."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["purelib"], paths["platlib"], *site.getsitepackages(), *EXTRA_ROOTS}
    return sorted(r for r in roots if os.path.isdir(r))


def text_files(roots: list[str]) -> list[str]:
    """Every text file under ``roots`` once (by real path), in sorted order."""
    found: dict[str, str] = {}
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if name.endswith(SUFFIXES):
                    path = os.path.join(folder, name)
                    found.setdefault(os.path.realpath(path), path)
    return sorted(found)


def _blocks(path: str) -> Iterator[str]:
    """Raw prose blocks of one file: string literals (docstrings, messages) and comments of code,
    paragraphs of documents. Adjacent string literals (implicit concatenation) are joined."""
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return
        raw = Path(path).read_bytes()
    except OSError:
        return
    if b"\0" in raw:
        return
    text = raw.decode("utf-8", "replace")
    if path.endswith(DOC_SUFFIXES):
        yield from _PARAGRAPH.split(_FENCE.sub("", text))
        return
    kind, run, end = "", "", 0
    for m in (_PY if path.endswith(PY_SUFFIXES) else _C).finditer(text):
        new, piece = ("s" if m.lastgroup in "stde" else "c"), m.group(m.lastgroup)  # a string, or a comment
        if m.lastgroup == "c":
            piece = piece.lstrip("#/!").strip()
        elif m.lastgroup == "b":
            piece = _STARS.sub("", piece)
        else:  # a literal's escaped newlines and tabs: paragraph breaks and spaces, as printed
            piece = piece.replace("\\n", "\n").replace("\\t", " ")
        gap = text[end:m.start()]
        if new == kind and not gap.strip(" \t\r\n\\rbufRBUF"):  # a comment's next line; implicit concatenation
            run += ("\n\n" if gap.count("\n") > 1 else "\n") + piece if new == "c" else piece
        else:
            if len(run) >= MIN_CHARS:  # most literals are short: names, keys, formats
                yield from _PARAGRAPH.split(run)
            run = piece
        kind, end = new, m.end()
    yield from _PARAGRAPH.split(run)


def _prose(block: str) -> bool:
    """Whether a whitespace-collapsed block reads like natural language rather than code or tables."""
    if len(block) < MIN_CHARS or block.startswith(("..", ">>>", "$ ", "|", "+-", "::", "http")):
        return False
    words = _WORD.findall(block)
    return len(words) >= 6 and sum(map(len, words)) >= 0.6 * len(block)


def file_passages(path: str) -> list[tuple[bytes, str]]:
    """The passages of one file, in file order, each with its dedup key: a hash of the passage as the
    uncased model reads it (case and spacing ignored)."""
    out = []
    for block in _blocks(path):
        block = " ".join(block.split())
        if not _prose(block):
            continue
        piece = ""
        for sentence in _SENTENCE_END.split(block):
            if piece and len(piece) + 1 + len(sentence) > MAX_CHARS:
                out.append(piece)
                piece = ""
            piece = f"{piece} {sentence}" if piece else sentence
        out.append(piece[:MAX_CHARS])
    return [(hashlib.blake2b(_SPACE.sub("", p.lower()).encode(), digest_size=12).digest(), p)
            for p in out if len(p) >= MIN_CHARS]


def passages(rows: int, seed: int, roots: list[str] | None = None, workers: int | None = None
             ) -> tuple[list[str], dict]:
    """``rows`` distinct passages (fewer if the machine has fewer), seeded order, and their provenance."""
    roots = roots or text_roots()
    files = text_files(roots)
    seen: set[bytes] = set()
    unique: list[str] = []
    total = 0
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        for found in pool.map(file_passages, files, chunksize=64):
            total += len(found)
            for key, p in found:
                if key not in seen:
                    seen.add(key)
                    unique.append(p)
    order = np.random.default_rng([seed, 7]).permutation(len(unique))[:rows]
    chosen = [unique[i] for i in order]
    digest = hashlib.sha256("\n".join(chosen).encode()).hexdigest()
    return chosen, {"text_roots": roots, "text_files": len(files), "passages_found": total,
                    "passages_unique": len(unique), "passages_sha256": digest,
                    "passage_chars_mean": round(float(np.mean([len(p) for p in chosen])), 1) if chosen else 0}


def _load_model(model_dir: Path):
    """(the sentence-transformers model from ``model_dir``, offline; whether it runs on CUDA): half precision on the
    GPU, float32 on the CPU, for both of the family's outputs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import sentence_transformers
    import torch

    cuda = torch.cuda.is_available()
    model = sentence_transformers.SentenceTransformer(str(model_dir), device="cuda" if cuda else "cpu")
    return (model.half() if cuda else model.float()), cuda


def _provenance(model, cuda: bool, model_dir: Path) -> dict:
    """The model's recorded origin (PROVENANCE.json) and what embedded with it here."""
    import sentence_transformers
    import torch
    import transformers

    prov = json.loads((model_dir / "PROVENANCE.json").read_text())
    prov.update(device=torch.cuda.get_device_name() if cuda else "cpu", compute_dtype="float16" if cuda else "float32",
                max_seq_length=model.max_seq_length, torch=torch.__version__, transformers=transformers.__version__,
                sentence_transformers=sentence_transformers.__version__, python=sys.version.split()[0])
    return prov


def embed(texts: list[str], out: np.ndarray, model_dir: Path = MODEL_DIR, batch: int | None = None) -> dict:
    """Embed ``texts`` into ``out`` (rows, 384), unit norm in float32 before the cast to out's dtype."""
    model, cuda = _load_model(model_dir)
    batch = batch or (1024 if cuda else 32)  # encode sorts by length: small CPU batches pad little
    step, t0 = 1 << 17, time.perf_counter()
    for start in range(0, len(texts), step):
        x = model.encode(texts[start:start + step], batch_size=batch, convert_to_numpy=True,
                         normalize_embeddings=False, show_progress_bar=False).astype(np.float32)
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        out[start:start + len(x)] = x
        print(f"text: embedded {start + len(x)}/{len(texts)} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return _provenance(model, cuda, model_dir)


def embed_tokens(texts: list[str], rows: int, model_dir: Path = MODEL_DIR, batch: int | None = None
                 ) -> tuple[np.ndarray, dict]:
    """The first ``rows`` word-piece embeddings of ``texts`` in order ((rows, 384) float32, unit norm; fewer if
    the texts hold fewer), and the provenance."""
    model, cuda = _load_model(model_dir)
    out = np.empty((rows, 384), np.float32)
    at, used, step, t0 = 0, 0, 1 << 14, time.perf_counter()
    while at < rows and used < len(texts):
        part = texts[used:used + step]
        used += len(part)
        for emb in model.encode(part, batch_size=batch or (512 if cuda else 32), output_value="token_embeddings",
                                convert_to_numpy=False, show_progress_bar=False):
            words = emb[1:-1].float().cpu().numpy()[: rows - at]  # without [CLS] and [SEP]
            out[at:at + len(words)] = words
            at += len(words)
            if at == rows:
                break
        print(f"tokens: {at}/{rows} from {used} passages in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    out = out[:at]
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out, {**_provenance(model, cuda, model_dir), "output": "token_embeddings (last layer, no [CLS]/[SEP])",
                 "passages_used": used}
