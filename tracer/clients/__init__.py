"""Seams into RocketMQ clients: the official 5.x gRPC client and the legacy 2.x API."""
