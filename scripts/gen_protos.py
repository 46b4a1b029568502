#!/usr/bin/env python3
"""Generate the Python stubs of Fortis's contracts: the one generation script.

    python scripts/gen_protos.py            # write stubs into clients/python/fortis/<area>/v1/
    python scripts/gen_protos.py --check    # exit 1 if the checked-in stubs are stale

Sources: protos/fortis/**/*.proto (one copy of each). The google/{api,rpc} protos are vendored
in protos/ for buf and other languages; at run time their Python modules come from
googleapis-common-protos, so they are not generated here. Generated with grpcio-tools 1.81.1,
whose code imports under protobuf 6 and 7. Never edit the output by hand.

It also writes infra/serving/fortis_descriptors.binpb: a FileDescriptorSet of the contracts
*with their comments* (source info, which the _pb2 modules strip) plus google/rpc's status,
code and error_details, so server reflection (infra/serving/server.py) can hand `buf curl`,
grpcurl and IDEs the documented contracts and the error-detail types (google.rpc.BadRequest
decodes instead of showing as base64). Other languages generate from protos/buf.gen.yaml.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "clients" / "python"
#: Served by reflection; see the module docstring.
DESCRIPTORS = ROOT / "infra" / "serving" / "fortis_descriptors.binpb"
#: Not imported by any fortis proto, but their messages travel as google.rpc.Status details.
EXTRA_DESCRIPTOR_SOURCES = ("google/rpc/error_details.proto",)
GENERATED_HEADER = '"""Generated from protos/ by scripts/gen_protos.py. Do not edit."""\n'


def generate(out_root: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency only

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "fortis").rglob("*.proto"))
    args = ["protoc", f"-I{PROTOS}", f"-I{wkt}", f"--python_out={out_root}",
            f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", *sources]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written: list[Path] = []
    for src in sources:
        pkg_dir = out_root / Path(src).parent
        # Make every generated folder a regular package (fortis.<area>.v1).
        d = pkg_dir
        while d != out_root / "fortis" and d != out_root:
            init = d / "__init__.py"
            if not init.exists():
                init.write_text(GENERATED_HEADER)
            written.append(init)
            d = d.parent
        stem = Path(src).stem
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            written.append(pkg_dir / f"{stem}{suffix}")
    return sorted(set(written))


def generate_descriptor_set(out: Path) -> None:
    """Write the contracts' FileDescriptorSet with source info (comments) and all imports.

    The well-known google/protobuf files keep no source info: every client has them built in,
    and their comments would triple the file's size.
    """
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc  # dev dependency only

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "fortis").rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "set.binpb"
        args = ["protoc", f"-I{PROTOS}", f"-I{wkt}", f"--descriptor_set_out={raw}",
                "--include_imports", "--include_source_info", *sources,
                *EXTRA_DESCRIPTOR_SOURCES]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed (descriptor set)")
        fds = descriptor_pb2.FileDescriptorSet.FromString(raw.read_bytes())
    for f in fds.file:
        if f.name.startswith("google/protobuf/"):
            f.ClearField("source_code_info")
    out.write_bytes(fds.SerializeToString(deterministic=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with checked-in stubs")
    ns = parser.parse_args()
    if not ns.check:
        files = generate(OUT)
        generate_descriptor_set(DESCRIPTORS)
        print(f"wrote {len(files)} files under {OUT.relative_to(ROOT)}/fortis and "
              f"{DESCRIPTORS.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        (tmp_root / "fortis").mkdir()
        files = generate(tmp_root)
        stale = []
        for f in files:
            rel = f.relative_to(tmp_root)
            mine = OUT / rel
            if not mine.exists() or not filecmp.cmp(f, mine, shallow=False):
                stale.append(str(rel))
        fresh = tmp_root / DESCRIPTORS.name
        generate_descriptor_set(fresh)
        if not DESCRIPTORS.exists() or not filecmp.cmp(fresh, DESCRIPTORS, shallow=False):
            stale.append(str(DESCRIPTORS.relative_to(ROOT)))
        if stale:
            print("stale generated stubs (run scripts/gen_protos.py):", *stale, sep="\n  ")
            return 1
        print(f"{len(files) + 1} generated files up to date")
        return 0


if __name__ == "__main__":
    sys.exit(main())
