"""Test-session set-up shared by all tests."""

import os

# Two host CPU devices, so the sweep engine's sharded path runs on CPU too. XLA
# reads the flag when JAX initialises, which happens after this file is imported.
_FLAG = "--xla_force_host_platform_device_count=2"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
