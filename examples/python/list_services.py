"""Lists the services a replica's gRPC port serves, by server reflection (what grpcurl's
`list` does), one per line: python list_services.py HOST:PORT"""

import sys

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

with grpc.insecure_channel(sys.argv[1]) as channel:
    database = ProtoReflectionDescriptorDatabase(channel)
    for service in database.get_services():
        print(service)
