"""gRPC servicer: protobuf <-> engine dataclasses; exceptions -> gRPC status in one place."""
