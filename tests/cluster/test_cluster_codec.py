"""Annotation encodings: the seed's and the issue's examples, HAMi's JSON quirks, strict errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyvgpu.cluster.core import codec
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import ContainerDevice, DeviceInfo

D = ContainerDevice


# --- allocations: HAMi's annotation encoding (docs/cluster.md, "The model") and the issue -----------------------

def test_seed_single_device():
    assert codec.decode_pod_devices("GPU-abc123,NVIDIA,8192,30") == ((D("GPU-abc123", "NVIDIA", 8192, 30),),)


def test_seed_one_container_two_devices():
    pd = codec.decode_pod_devices("GPU-abc,NVIDIA,4096,50:GPU-def,NVIDIA,4096,50")
    assert pd == ((D("GPU-abc", "NVIDIA", 4096, 50), D("GPU-def", "NVIDIA", 4096, 50)),)
    # HAMi writes a ':' after every device and a ';' after every container.
    assert codec.encode_pod_devices(pd) == "GPU-abc,NVIDIA,4096,50:GPU-def,NVIDIA,4096,50:;"
    assert codec.decode_pod_devices(codec.encode_pod_devices(pd)) == pd


def test_seed_two_containers():
    text = "GPU-abc,NVIDIA,8192,30:GPU-def,NVIDIA,4096,20;GPU-ghi,NVIDIA,16384,100"
    pd = codec.decode_pod_devices(text)
    assert pd == ((D("GPU-abc", "NVIDIA", 8192, 30), D("GPU-def", "NVIDIA", 4096, 20)),
                  (D("GPU-ghi", "NVIDIA", 16384, 100),))
    encoded = codec.encode_pod_devices(pd)
    assert encoded == "GPU-abc,NVIDIA,8192,30:GPU-def,NVIDIA,4096,20:;GPU-ghi,NVIDIA,16384,100:;"
    assert codec.decode_pod_devices(encoded) == pd


def test_issue_examples_exactly():
    one = ((D("GPU-x", "NVIDIA", 8192, 30),),)
    assert codec.encode_pod_devices(one) == "GPU-x,NVIDIA,8192,30:;"
    assert codec.decode_pod_devices("GPU-x,NVIDIA,8192,30:;") == one
    # A container without devices stays an empty entry, so indices line up with the containers.
    two = ((D("GPU-x", "NVIDIA", 8192, 30),), ())
    assert codec.encode_pod_devices(two) == "GPU-x,NVIDIA,8192,30:;;"
    assert codec.decode_pod_devices("GPU-x,NVIDIA,8192,30:;;") == two
    assert codec.decode_pod_devices(";GPU-x,NVIDIA,1,2:;") == ((), (D("GPU-x", "NVIDIA", 1, 2),))
    assert codec.decode_pod_devices("") == ()
    assert codec.decode_pod_devices(";") == ((),)


entries = st.builds(D, st.from_regex(r"GPU-[a-f0-9]{1,8}(\[[0-3]-[0-6]\])?", fullmatch=True), st.just("NVIDIA"),
                    st.integers(0, 2**31 - 1), st.integers(0, 100))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(entries, max_size=4).map(tuple), max_size=5).map(tuple))
def test_encoding_round_trips(pd):
    assert codec.decode_pod_devices(codec.encode_pod_devices(pd)) == pd


@pytest.mark.parametrize("text, field", [
    ("GPU-x,NVIDIA,abc,30:;", "container 0 device 0 UsedMem"),
    ("GPU-x,NVIDIA,8192,-1:;", "container 0 device 0 UsedCores"),
    ("GPU-x,NVIDIA,8192:;", "container 0 device 0"),
    ("GPU-x,NVIDIA,8192,30,9:;", "container 0 device 0"),
    (";GPU-x,NVIDIA,1,1::GPU-y,NVIDIA,1,1:;", "container 1 device 1"),
    (",NVIDIA,1,1:;", "container 0 device 0 UUID"),
    ("GPU-x,,1,1:;", "container 0 device 0 Type"),
    ("GPU-x[1],NVIDIA,1,1:;", "container 0 device 0 UUID"),
    ("GPU-x,NVIDIA,99999999999,1:;", "container 0 device 0 UsedMem"),
])
def test_bad_allocations_name_the_field(text, field):
    with pytest.raises(ClusterInputError) as e:
        codec.decode_pod_devices(text, "hami.io/vgpu-devices-allocated")
    assert e.value.field == f"hami.io/vgpu-devices-allocated: {field}"
    assert str(e.value).startswith("hami.io/vgpu-devices-allocated")


def test_mig_uuid_suffix():
    assert codec.split_mig_uuid("GPU-x[1-3]") == ("GPU-x", 1, 3)
    assert codec.split_mig_uuid("GPU-x") == ("GPU-x", None, None)
    with pytest.raises(ClusterInputError):
        codec.split_mig_uuid("GPU-x[a-3]")


# --- node registration ---------------------------------------------------------------------------------------

SEED_REGISTER = """[{"id": "GPU-abc123", "index": 0, "count": 10, "devmem": 81920, "devcore": 100,
  "type": "NVIDIA A100-SXM4-80GB", "numa": 0, "mode": "hami-core", "health": true}]"""


def test_seed_registration():
    assert codec.decode_register(SEED_REGISTER) == [
        DeviceInfo("GPU-abc123", 0, 10, 81920, 100, "NVIDIA A100-SXM4-80GB", 0, "hami-core", True)]


def test_registration_round_trips():
    devs = [DeviceInfo("GPU-a", 0, 10, 81920, 100, "A100", 0, "hami-core", True),
            DeviceInfo("GPU-b", 1, 4, 16384, 100, "T4", 1, "mps", False)]
    assert codec.decode_register(codec.encode_register(devs)) == devs


def test_registration_reads_go_omitempty_and_case():
    # HAMi's Go encoder leaves zero values out (index 0, numa 0, health false, mode ""), and Go's decoder
    # matches keys case-insensitively and ignores unknown ones.
    devs = codec.decode_register('[{"ID":"GPU-a","count":10,"devmem":1024,"devcore":100,"type":"T4",'
                                 '"devicevendor":"NVIDIA","customInfo":{}}]')
    assert devs == [DeviceInfo("GPU-a", 0, 10, 1024, 100, "T4", 0, "hami-core", False)]


def test_registration_older_colon_form():
    devs = codec.decode_register("GPU-a,10,81920,100,NVIDIA-A100,0,true:GPU-b,10,81920,100,NVIDIA-A100,1,false,1,mps:")
    assert devs == [DeviceInfo("GPU-a", 0, 10, 81920, 100, "NVIDIA-A100", 0, "hami-core", True),
                    DeviceInfo("GPU-b", 1, 10, 81920, 100, "NVIDIA-A100", 1, "mps", False)]


@pytest.mark.parametrize("text, field", [
    ("{bad", "hami.io/node-nvidia-register"),
    ('{"id": "GPU-a"}', "hami.io/node-nvidia-register"),
    ('[{"id": "GPU-a", "devmem": "80GB"}]', "hami.io/node-nvidia-register[0].devmem"),
    ('[{"id": "GPU-a", "count": 1.5}]', "hami.io/node-nvidia-register[0].count"),
    ('[{"id": "GPU-a", "count": true}]', "hami.io/node-nvidia-register[0].count"),
    ('[{"id": "GPU-a", "health": "yes"}]', "hami.io/node-nvidia-register[0].health"),
    ('[{"id": "GPU-a", "mode": "vgpu"}]', "hami.io/node-nvidia-register[0].mode"),
    ('[{"id": "GPU-a"}, {"count": 1}]', "hami.io/node-nvidia-register[1].id"),
    ('[{"id": "GPU-a"}, {"id": "GPU-a"}]', "hami.io/node-nvidia-register[1].id"),
    ('[{"id": "GPU-a", "devmem": -5}]', "hami.io/node-nvidia-register[0].devmem"),
    ('[{"id": "GPU-a", "mode": "mig", "migtemplate": [[{"name": "1g", "memory": 1}]]}]',
     "hami.io/node-nvidia-register[0].migtemplate[0][0]"),
    ("GPU-a,10,x,100,T4,0,true:", "hami.io/node-nvidia-register[0].devmem"),
])
def test_bad_registration_names_the_field(text, field):
    with pytest.raises(ClusterInputError) as e:
        codec.decode_register(text)
    assert e.value.field == field


def test_registered_mig_templates():
    text = json.dumps([{"id": "GPU-m", "count": 7, "devmem": 40960, "devcore": 100, "type": "X", "mode": "mig",
                        "health": True, "migtemplate": [[{"Name": "1g.5gb", "Core": 14, "Memory": 5120,
                                                          "Count": 7}]]}])
    (d,) = codec.decode_register(text)
    assert d.mig_geometries[0][0].name == "1g.5gb" and d.mig_geometries[0][0].count == 7
    assert codec.decode_register(codec.encode_register([d])) == [d]


# --- pair scores ---------------------------------------------------------------------------------------------

def test_pair_scores():
    scores = {"GPU-a": {"GPU-b": 200}, "GPU-b": {"GPU-a": 200}}
    assert codec.decode_pair_scores(codec.encode_pair_scores(scores)) == scores
    assert codec.decode_pair_scores('[{"uuid": "GPU-a", "score": {"GPU-b": 60}}]') == {"GPU-a": {"GPU-b": 60}}
    assert codec.decode_pair_scores("null") == {}


@pytest.mark.parametrize("text, field", [
    ("[{", "hami.io/node-nvidia-score"),
    ('[{"score": {}}]', "hami.io/node-nvidia-score[0].uuid"),
    ('[{"uuid": "GPU-a", "score": {"GPU-b": "high"}}]', "hami.io/node-nvidia-score[0].score.GPU-b"),
    ('[{"uuid": "GPU-a", "score": [1]}]', "hami.io/node-nvidia-score[0].score"),
])
def test_bad_pair_scores(text, field):
    with pytest.raises(ClusterInputError) as e:
        codec.decode_pair_scores(text)
    assert e.value.field == field


# --- JSON a node or pod creator can write that json.loads fails on by more than a syntax error -----------------

DEEP = "[" * 5000 + "]" * 5000  # deeper than the interpreter's recursion limit
LONG = "9" * 5000  # more digits than int() converts


@pytest.mark.parametrize("decode, text", [
    (codec.decode_register, DEEP),
    (codec.decode_register, '[{"id":"GPU-a","count":' + LONG + "}]"),
    (codec.decode_pair_scores, DEEP),
    (codec.decode_pair_scores, '[{"uuid":"a","score":{"b":' + LONG + "}}]"),
    (codec.decode_mig_allocations, DEEP),
    (codec.decode_mig_allocations, '[{"containerIndex":' + LONG + "}]"),
])
def test_deep_or_long_json_is_an_input_error(decode, text):
    with pytest.raises(ClusterInputError) as e:
        decode(text)
    assert e.value.field.startswith("hami.io/")
    assert "nested too deep" in e.value.detail or "number too long" in e.value.detail
