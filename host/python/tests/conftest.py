import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest

VECTORS = Path(os.environ.get("BACKSTOP_VECTORS", Path(__file__).resolve().parents[3] / "testdata" / "vectors" / "vectors.json"))


def load_vectors() -> Dict[str, Any]:
    if not VECTORS.is_file():
        pytest.skip("shared vectors not found at %s (set BACKSTOP_VECTORS)" % VECTORS)
    return json.loads(VECTORS.read_text())


def vector_input(inp: Dict[str, Any]) -> Dict[str, Any]:
    """A vector input as decide() fields: absent random and now_ms are 0 in
    the vectors (decide would draw and read the clock)."""
    f = dict(inp)
    f.setdefault("random", 0)
    f.setdefault("now_ms", 0)
    if isinstance(f["random"], str):
        f["random"] = float(f["random"])  # "NaN", "Infinity", "-Infinity"
    return f


def group_source(g: Dict[str, Any]) -> Any:
    return g["preset"] if g.get("preset") else g["policy"]
