"""The per-node agent: collectors turn GPU and kernel observations into signals, a durable spool
numbers and keeps them, and a gRPC link delivers them to the controller. Never imports torch."""
