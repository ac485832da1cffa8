"""Test-wide settings: offline Hugging Face, 8 fake CPU devices for sharding tests.

These must be set before jax is imported anywhere, hence at the top of conftest.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# CI runs the property tests on a fixed example sequence, so a submission's result does not
# depend on the draw; locally hypothesis explores new examples on every run.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
