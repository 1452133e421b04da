"""Turn the cuGetProcAddress answers measured on a real driver into the
fake driver's lookup table (a C header).

    python tests/fakecuda/gen_procaddr_table.py docs/facts/procaddr-h100-driver580.tsv OUT.h

The fake then answers exactly as the real driver did, independently of
pyvgpu's hook table, so the CPU tests compare the shim with the driver's
recorded behaviour rather than with itself.
"""

import sys


def rows(tsv_path):
    seen = {}
    for line in open(tsv_path):
        if line.startswith("#") or not line.strip():
            continue
        name, ver, flags, rc, status, sym, *_ = line.rstrip("\n").split("\t")
        ver, flags, rc, status = int(ver), int(flags), int(rc), int(status)
        if rc != 0 or flags == 1:  # versions beyond the driver; flags 1 answers as flags 0
            continue
        fclass = 2 if flags == 2 else 0
        abi = "" if sym == "-" else sym
        key = (name, fclass)
        segs = seen.setdefault(key, [])
        if not segs or segs[-1][1:] != (status, abi):
            segs.append((ver, status, abi))
    for (name, fclass), segs in seen.items():
        for ver, status, abi in segs:
            yield name, fclass, ver, status, abi


def main(src, dst):
    out = ["/* generated from " + src.split("/")[-1] + " by gen_procaddr_table.py */",
           "static const struct fake_gpa_row fake_gpa_rows[] = {"]
    for name, fclass, ver, status, abi in rows(src):
        out.append(f'    {{"{name}", {fclass}, {ver}, {status}, "{abi}"}},')
    out.append("};")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
