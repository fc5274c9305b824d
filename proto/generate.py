"""Regenerate the Python code for kubelet's gRPC contracts from the upstream .proto files.

    .venv/bin/python proto/generate.py            # rewrite proto/fabricdra/proto/gen/
    .venv/bin/python proto/generate.py --check    # exit 1 when the checked-in code is stale

Each upstream file is compiled as `fabricdra/proto/gen/<module>/api.proto`, so the generated
modules import each other as `fabricdra.proto.gen.<module>` and their descriptor file names
cannot collide with another library's copy of the same protos. Package names are untouched:
they are the gRPC service paths kubelet dials.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # dev dependency (grpcio-tools)

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream" / "k8s.io" / "kubelet" / "pkg" / "apis"
GEN = HERE / "fabricdra" / "proto" / "gen"

# Python module name -> upstream directory ("dra-health" is not a Python identifier).
MODULES = {
    "pluginregistration_v1": "pluginregistration/v1",
    "dra_v1": "dra/v1",
    "dra_v1beta1": "dra/v1beta1",
    "dra_health_v1alpha1": "dra-health/v1alpha1",
    "dra_health_v1": "dra-health/v1",
}

GEN_INIT = '"""Generated from proto/upstream by proto/generate.py; do not edit."""\n'

_GOGO_IMPORT = re.compile(r'^import\s+"github\.com/gogo/protobuf/gogoproto/gogo\.proto";\s*$', re.M)
_GOGO_OPTION = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def strip_gogoproto(source: str) -> str:
    """Drop gogoproto's import and field options: protoc for Python cannot resolve them and
    they do not change the wire format (only Go field names)."""
    return _GOGO_OPTION.sub("", _GOGO_IMPORT.sub("", source))


def generate(out: Path) -> None:
    """Write the generated package (with __init__.py files) into `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        dst = Path(tmp) / "out"
        dst.mkdir()
        files = []
        for module, upstream in MODULES.items():
            rel = Path("fabricdra", "proto", "gen", module, "api.proto")
            (src / rel).parent.mkdir(parents=True)
            text = (UPSTREAM / upstream / "api.proto").read_text()
            (src / rel).write_text(strip_gogoproto(text))
            files.append(str(rel))
        args = [
            "grpc_tools.protoc",
            f"-I{src}",
            f"--python_out={dst}",
            f"--pyi_out={dst}",
            f"--grpc_python_out={dst}",
            *files,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {files}")
        out.mkdir(parents=True, exist_ok=True)
        (out / "__init__.py").write_text(GEN_INIT)
        for module in MODULES:
            target = out / module
            target.mkdir(exist_ok=True)
            (target / "__init__.py").write_text(GEN_INIT)
            for f in sorted((dst / "fabricdra" / "proto" / "gen" / module).iterdir()):
                shutil.copyfile(f, target / f.name)


def differences(a: Path, b: Path) -> list[str]:
    """Relative paths of .py/.pyi files that differ between two generated trees."""
    names = {
        p.relative_to(root).as_posix()
        for root in (a, b)
        for p in root.rglob("*")
        if p.suffix in (".py", ".pyi")
    }
    return sorted(
        n
        for n in names
        if not ((a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, False))
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(GEN, ignore_errors=True)
        generate(GEN)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "gen"
        generate(fresh)
        stale = differences(fresh, GEN)
    for name in stale:
        print(f"stale: proto/fabricdra/proto/gen/{name}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
