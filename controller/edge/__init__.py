"""Where the wire ends: the gRPC services, who may call them, and what they refuse."""
