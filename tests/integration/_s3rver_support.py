"""A real S3-compatible HTTP server for the S3 dataset store tests: s3rver (npm, installed by
scripts/setup_s3rver.sh into .s3rver/), started on a free loopback port.

s3rver is an emulator -- no real S3 server installs offline here (see the set-up script) --
but it speaks S3 over HTTP (ranged GETs, HEAD, streamed bodies) and checks each signed
request's access key id against its one account (S3RVER / S3RVER): another key id is refused
with InvalidAccessKeyId. It does not verify V4 signatures (unimplemented in s3rver), so a
wrong secret with the right key id is not caught here.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ACCESS_KEY = "S3RVER"
SECRET_KEY = "S3RVER"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def s3rver(folder: Path, *buckets: str) -> Iterator[str]:
    """The endpoint URL of an s3rver serving ``folder`` with ``buckets`` created."""
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup_s3rver.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, f"scripts/setup_s3rver.sh failed: {r.stderr[-500:]}"
    binary = ROOT / r.stdout.strip().splitlines()[-1]
    port = _free_port()
    cmd = [
        "node",
        str(binary),
        "-d",
        str(folder),
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        "--silent",
        "--no-vhost-buckets",
    ]
    for b in buckets:
        cmd += ["--configure-bucket", b]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, f"s3rver exited: {proc.stderr.read()[-500:]!r}"
            assert time.monotonic() < deadline, "s3rver did not listen within 30 s"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def client(endpoint: str) -> object:
    """A botocore S3 client signed with s3rver's account, to put the test's objects."""
    import botocore.config
    import botocore.session

    return botocore.session.Session().create_client(
        "s3",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=botocore.config.Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def upload_tree(c: object, bucket: str, folder: Path, prefix: str) -> None:
    """Every file under ``folder`` as ``prefix/<relative path>``."""
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            c.put_object(
                Bucket=bucket,
                Key=f"{prefix}/{p.relative_to(folder).as_posix()}",  # type: ignore[attr-defined]
                Body=p.read_bytes(),
            )
