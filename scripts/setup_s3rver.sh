#!/usr/bin/env bash
# Idempotent set-up of .s3rver/: s3rver 3.7.1 (npm), the S3-compatible server the S3 dataset
# store tests read from (tests/integration/test_s3_datasets.py, tests/e2e/...).
#
# It is an emulator: no real S3 server installs offline here (MinIO, SeaweedFS, Garage and
# versitygw are not in PyPI/npm/Debian as servers; Debian's radosgw is Ceph 16, which needs a
# RADOS cluster; Zenko CloudServer's npm package needs git dependencies). s3rver (pure
# JavaScript, 3 s to install) speaks S3 over HTTP and refuses an unknown access key id
# (InvalidAccessKeyId), so the tests see which tenant credential a request carried; it does not
# verify V4 signatures. Its own folder (not node_modules/) so it never touches the project's
# npm tree.
#
#   scripts/setup_s3rver.sh        # prints the path of the s3rver executable
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${S3RVER_DIR:-.s3rver}
VERSION=3.7.1
BIN="$DIR/node_modules/.bin/s3rver"
stamp="$DIR/.fortis-s3rver-$VERSION"
if [ -x "$BIN" ] && [ -f "$stamp" ]; then
  echo "$BIN"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup_s3rver: npm is not installed (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
mkdir -p "$DIR"
echo "setup_s3rver: installing s3rver $VERSION into $DIR ..." >&2
npm install --prefix "$DIR" --no-audit --no-fund --no-save --silent "s3rver@$VERSION" >/dev/null
[ -x "$BIN" ] || { echo "setup_s3rver: s3rver did not install" >&2; exit 1; }
touch "$stamp"
echo "$BIN"
