"""The gRPC server plumbing shared by every service: built by :func:`server.build_server`."""
