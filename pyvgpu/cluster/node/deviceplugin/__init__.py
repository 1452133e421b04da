"""The kubelet's device-plugin API (v1beta1): api.proto and the stubs scripts/gen_protos.py generates from it.

Importing this package imports nothing; `from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2` loads
protobuf and `api_pb2_grpc` grpc.
"""
