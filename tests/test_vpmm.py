"""VPMM on the fake driver's VMM (it maps page by page and refuses overlapping maps): the seed's
walkthrough, the multi-stream rules, zombies, and random sequences against the pool's invariants.
Each scenario runs in its own process (tests/hosts/vpmm_cases.py) on a 256 GiB fake device."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run

CASES = Path(__file__).resolve().parent / "hosts" / "vpmm_cases.py"
G = 1 << 30
MiB = 1 << 20


def case(env, *args: str) -> dict:
    p = run([sys.executable, str(CASES), *args], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# The seed's walkthrough (+10 +1 -10 +4 +11 in 1 GiB pages) from PAGES preallocated pages, X = PAGES - 11.
# Layouts in the seed's notation, live regions as '+'; 'z' is a zombie (the seed draws it as '*' too).
WALK = {
    22: ("A", ["[+10][-12]", "[+10][+1][-11]", "[-10][+1][-11]", "[+4][-6][+1][-11]", "[+4][-6][+1][+11]",
               "[+4][-6][+1][+11]"], 22),
    18: ("B", ["[+10][-8]", "[+10][+1][-7]", "[-10][+1][-7]", "[-10][+1][+4][-3]", "[z10][+1][+4][+11][-2]",
               "[*10][+1][+4][+11][-2]"], 18),
    15: ("C", ["[+10][-5]", "[+10][+1][-4]", "[-10][+1][-4]", "[-10][+1][+4]", "[z10][+1][+4][+11]",
               "[*10][+1][+4][+11]"], 16),
    12: ("D", ["[+10][-2]", "[+10][+1][-1]", "[-10][+1][-1]", "[+4][-6][+1][-1]", "[+4][z6][+1][+11]",
               "[+4][*6][+1][+11]"], 16),
}


@pytest.mark.parametrize("pages", sorted(WALK, reverse=True), ids=lambda p: f"case-{WALK[p][0]}-{p}-pages")
def test_seed_walkthrough(env, pages):
    _, steps, final_pages = WALK[pages]
    r = case(env, "walk", str(pages))
    assert r["steps"] == steps
    st = r["stats"]
    assert st["pages"] == final_pages and st["mapped"] == final_pages * G
    assert st["live"] == 16 * G and st["zombies"] == 0
    assert r["fake_mapped"] == st["mapped"]  # the driver's own count of mapped pages agrees
    assert st["defragmentations"] == (0 if pages == 22 else 1)


def test_streams_reuse_rules_and_zombies(env):
    r = case(env, "streams")
    assert r["same_stream_reuses_at_once"]  # stream order makes it safe without waiting
    before = r["other_stream_before_event"]
    # another stream does not take it while the freeing stream's work runs: its pages move (the GPU waits,
    # the CPU does not), no page is created, and the old address waits as a zombie
    assert before == {"same_address": False, "new_pages": 0, "zombies": 8 * MiB, "layout": "[z4][+4]"}
    assert r["double_mapped_while_zombie"]
    assert r["zombie_kept_while_busy"] == 8 * MiB
    assert r["zombie_unmapped_after_event"] == {"zombies": 0, "old_mapped": 0, "layout": "[*4][+4]"}
    assert r["other_stream_after_event_reuses"]  # once the event completed: reused in place
    assert r["small_goes_to_malloc_async"]
    assert "not a live allocation of this pool (freed twice" in r["bad_free"]


def test_random_sequences_keep_the_invariants(env):
    r = case(env, "property", "60")
    assert r["examples"] == 60 and r["steps"] > 100


def test_pool_pages_count_against_the_vgpu_cap(env, tmp_path):
    from helpers import PYVGPU

    reg = tmp_path / "g.region"
    p = run([*PYVGPU, "wrap", "--memory", "16M", "--region", str(reg), "--", sys.executable, str(CASES), "cap"],
            env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["pages"] == 8 and r["mapped"] == 16 * MiB  # 8 pages of 2 MiB fill the 16 MiB cap
    assert "out of device memory (or over the vGPU's cap)" in r["error"]
    assert r["reused"]


def test_the_shims_malloc_and_free_for_pytorch(env):
    p = run([sys.executable, str(CASES), "cexports"], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["big_in_pool"] and r["live"] == 6 * MiB and r["small_live"] == 512
    assert r["no_pool_device_3"] is None and "VPMM has no pool for device 3" in p.stderr
    assert r["after"] == {"live": 0, "reusable": 6 * MiB, "small_live": 0}
    assert "not a live allocation" in p.stderr  # the second free is reported and changes nothing


def test_pytorch_is_given_the_preloaded_shim(env, tmp_path):
    """CUDAPluggableAllocator dlopens a path: it must be the preloaded copy that holds the pools, even when
    the wrapped program's pyvgpu would name another build (found on a GPU: "VPMM has no pool")."""
    import shutil

    from helpers import PYVGPU

    from pyvgpu.shim import shim_path

    copy = tmp_path / "libpyvgpu.so"
    shutil.copy(shim_path(), copy)
    probe = "from pyvgpu import shim; print(shim.loaded_path(), shim.shim_path())"
    p = run([*PYVGPU, "wrap", "--", "env", "-u", "PYVGPU_SHIM", sys.executable, "-c", probe],
            env=dict(env, PYVGPU_SHIM=str(copy)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split() == [str(copy), str(shim_path())]


def test_wrap_allocator_option(env):
    from helpers import PYVGPU

    p = run([*PYVGPU, "wrap", "--allocator", "jemalloc", "--", "true"], env=env)
    assert p.returncode == 2 and "--allocator 'jemalloc' is not one of default, vpmm" in p.stderr
    probe = "import os, sys; print(os.environ.get('PYVGPU_ALLOCATOR'), any(type(f).__name__ == 'TorchHook' " \
            "for f in sys.meta_path))"
    p = run([*PYVGPU, "wrap", "--allocator", "vpmm", "--", sys.executable, "-c", probe], env=env)
    assert p.returncode == 0 and p.stdout.split() == ["vpmm", "True"], p.stdout + p.stderr


def test_fragmenting_trace_maps_only_its_live_pages_and_is_never_refused_with_room(env):
    """The bench's trace (growing KV buffers, transient activations) on a pool: the pages mapped never
    exceed the most pages live at once. On a device only a page larger, no request is refused while the
    device has room for it and a page more.
    (This trace found a defragmentation that overran a small hole; the fake's strict VMM refused the map.)"""
    free = case(env, "trace", "600")
    assert free["refused"] == 0 and free["defragmentations"] > 100
    assert free["peak_reserved"] == free["peak_live_pages"]  # nothing beyond the live pages
    assert 0 <= free["peak_live_pages"] - free["peak_live"] < 8 * 2 * MiB  # page rounding of the live buffers
    # a device with room for the live pages plus one: a request is refused only when the device really
    # has less free than the request and a page (small requests use cuMemAllocAsync memory beside the pool)
    snug = free["peak_live_pages"] + 2 * MiB
    p = run([sys.executable, str(CASES), "trace", "600"], env=dict(env, FAKECUDA_DEVICES=str(snug)), timeout=600)
    assert p.returncode == 0, p.stderr
    tight = json.loads(p.stdout.strip().splitlines()[-1])
    assert tight["refused_with_room"] == [] and tight["peak_reserved"] <= snug


def test_a_refused_request_leaves_the_pool_as_it_was(env, tmp_path):
    """The cap refuses a request half way through its new pages: they are released again and no free
    region has moved (before the fix, the moved regions and the new pages were lost to the pool)."""
    from helpers import PYVGPU

    p = run([*PYVGPU, "wrap", "--memory", "16M", "--region", str(tmp_path / "g.region"), "--", sys.executable,
             str(CASES), "refusal"], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert "over the vGPU's cap" in r["error"]
    assert r["after"] == r["before"]
    assert r["before"][0]["pages"] == 5 and r["before"][1] == "[+1][-1][+1][-1][+1]"
    assert r["fits"] and r["final"]["pages"] == 8
    assert r["fake_mapped"] == 16 * MiB + r["final"]["zombies"]  # the moved pages stay mapped at their old address too
