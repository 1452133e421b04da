"""Split pyvgpu/cluster into its layers (issue 28, item 1) and rewrite every reference; re-runnable.

    python scripts/split_cluster.py            # git mv what is still flat, then rewrite references
    python scripts/split_cluster.py --rewrite  # only rewrite (e.g. on a branch merged after the move)

The rewrite is idempotent: `pyvgpu.cluster.kube` becomes `pyvgpu.cluster.api.kube`, which it leaves alone;
`from pyvgpu.cluster import codec, nodelock` becomes one import per package. Files: every tracked text
file (Python, Markdown, TOML, YAML, shell), so tests, deploy/, docs and pyproject follow.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

LAYERS = {
    "core": ["keys", "model", "codec", "config", "errors", "request", "usage", "fit", "score", "policy", "place",
             "decide", "explain", "quota"],
    "api": ["kube", "nodelock", "events"],
    "scheduler": ["extender", "extender_server", "httpserve", "informer", "inflight", "recent", "liveness", "webhook",
                  "usage_metrics"],
    "node": ["agent", "allocate", "daemon", "gpus", "nodestate", "plugin", "records", "runtime", "deviceplugin"],
}
PACKAGE_OF = {m: pkg for pkg, mods in LAYERS.items() for m in mods}
ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "pyvgpu" / "cluster"
TEXT = (".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".sh", ".cfg", ".ini", ".in")
_MODS = "|".join(sorted(PACKAGE_OF, key=len, reverse=True))
DOTTED = re.compile(rf"\bpyvgpu\.cluster\.({_MODS})\b")
SLASHED = re.compile(rf"\bpyvgpu/cluster/({_MODS})(\.py\b|/|\b)")
FROM_IMPORT = re.compile(r"^(?P<indent>[ \t]*)from pyvgpu\.cluster import "
                         r"(?P<names>\([^)]*\)|[^\n#]*?)(?P<tail>[ \t]*(#[^\n]*)?)$", re.M)
INLINE = re.compile(rf"(?<=; )from pyvgpu\.cluster import ({_MODS})\b(?=( as \w+)?;)")  # code in a string


def move() -> None:
    for pkg, mods in LAYERS.items():
        (CLUSTER / pkg).mkdir(exist_ok=True)
        for m in mods:
            src = CLUSTER / (m if m == "deviceplugin" else f"{m}.py")
            if src.exists():
                dst = CLUSTER / pkg / src.name
                subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)


def _split_from_import(m: re.Match) -> str:
    names = [n.strip() for n in m["names"].strip("()").replace("\n", " ").split(",") if n.strip()]
    groups: dict[str, list[str]] = {}
    for n in names:
        pkg = PACKAGE_OF.get(n.split(" as ")[0].strip())
        groups.setdefault(f"pyvgpu.cluster.{pkg}" if pkg else "pyvgpu.cluster", []).append(n)
    lines = [f"{m['indent']}from {mod} import {', '.join(sorted(ns, key=str.lower))}" for mod, ns in groups.items()]
    return "\n".join(lines) + m["tail"]


def rewrite(text: str) -> str:
    text = FROM_IMPORT.sub(_split_from_import, text)
    text = INLINE.sub(lambda m: f"from pyvgpu.cluster.{PACKAGE_OF[m[1]]} import {m[1]}", text)
    text = DOTTED.sub(lambda m: f"pyvgpu.cluster.{PACKAGE_OF[m[1]]}.{m[1]}", text)
    return SLASHED.sub(lambda m: f"pyvgpu/cluster/{PACKAGE_OF[m[1]]}/{m[1]}{m[2]}", text)


def main(argv: list[str]) -> int:
    if "--rewrite" not in argv:
        move()
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    changed = 0
    for f in files:
        p = ROOT / f
        if not p.is_file() or not f.endswith(TEXT) or f == "scripts/split_cluster.py" or f.startswith(".git"):
            continue
        try:
            old = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(old)
        if new != old:
            p.write_text(new)
            changed += 1
    print(f"rewrote {changed} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
