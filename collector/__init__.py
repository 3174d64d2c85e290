"""Subscribes to vLLM KV event streams and rebuilds each publisher's prefix-cache map exactly."""
