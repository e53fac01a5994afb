"""Regenerate the committed protobuf/gRPC Python code: ``python -m protos.generate [OUT_DIR]``.

The ``.proto`` files import each other by their path from the repository root, so the generated
modules import each other as ``protos.vigil.v1.*`` and need no ``sys.path`` tricks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("protos/vigil/v1")


def proto_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / PROTO_DIR).glob("*.proto"))


def generate(out_dir: Path = ROOT) -> None:
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(ROOT / f) for f in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
