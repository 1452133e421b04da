"""The exporter under a container that writes its own region (issue 29, item 8 of the attacks): a region
claiming more slots than any pyvgpu makes is skipped with the reason, and scrapes close together share
one read (docs/security.md, the cluster table)."""

from __future__ import annotations

from pyvgpu.contract import layout as L
from pyvgpu.group import region
from pyvgpu.ops import exporter


def test_a_region_claiming_too_many_slots_is_skipped_not_read(tmp_path, capsys):
    """Before: a member's header said 1.3 M slots (the file grown sparsely to match) and every scrape read
    1 GB. 100 000 here: a consistent header and size, so only the slot cap refuses it."""
    big = tmp_path / "big.region"
    region.create(big, region.GroupSpec("big", [0] * L.MAX_DEVICES), n_slots=100_000)
    assert big.stat().st_size == L.region_size(100_000)
    families = {f.name: f for f in exporter.RegionCollector(region_path=str(big), machine=lambda: None).collect()}
    assert not families["pyvgpu_memory_limit_bytes"].samples
    err = capsys.readouterr().err
    assert f"skipped {big}" in err and "100000 process slots" in err


def test_a_region_of_the_default_size_is_still_read(tmp_path):
    ok = tmp_path / "ok.region"
    region.create(ok, region.GroupSpec("ok", [64 << 20] * L.MAX_DEVICES))
    r = region.open_region(ok, writable=False)
    assert r.header.n_slots == L.DEFAULT_SLOTS <= region.MAX_SLOTS


def test_scrapes_within_the_cache_time_share_one_read(tmp_path, monkeypatch):
    """Before: every scrape read every region (20 scrapers at once: p50 2 s with one big region)."""
    reads = []
    real = exporter.st.collect
    monkeypatch.setattr(exporter.st, "collect", lambda **kw: reads.append(1) or real(**kw))
    now = [100.0]
    c = exporter.RegionCollector(region_path=None, machine=lambda: None, state_dir=str(tmp_path),
                                 clock=lambda: now[0])
    for _ in range(5):
        list(c.collect())
    assert len(reads) == 1
    now[0] += exporter.SCRAPE_CACHE_S
    list(c.collect())
    assert len(reads) == 2
