"""The committed generated protobuf code is what `make protos` would produce now."""

from __future__ import annotations

import filecmp
from pathlib import Path

from protos.generate import ROOT, generate

GENERATED = ROOT / "protos" / "vigil" / "v1"


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh = tmp_path / "protos" / "vigil" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names, "protoc produced nothing"
    committed = sorted(p.name for p in GENERATED.iterdir() if "_pb2" in p.name)
    assert committed == names, "generated files added or removed: run `make protos`"
    stale = [n for n in names if not filecmp.cmp(fresh / n, GENERATED / n, shallow=False)]
    assert not stale, f"stale generated code {stale}: run `make protos` and commit the result"
