"""Which devices each role of a run uses: the trainer's mesh over every process, and this
process's sampler mesh (generation is process-local). Colocated, both use every device;
disaggregated (rl.sampler_devices = N, ada/stream.py), each process's last N devices sample
and the others train."""

from __future__ import annotations

import jax

from ada import sharding as shd
from ada.errors import ConfigError


def role_devices(config) -> tuple[list, list]:
    """(the trainer's devices over every process, this process's sampler devices): all of
    them for both when colocated; with rl.sampler_devices = N each process's last N sample
    and the others train (ada/stream.py)."""
    n = config.rl.sampler_devices
    if not n:
        return jax.devices(), jax.local_devices()
    if jax.process_count() > 1:
        raise ConfigError(f"rl.sampler_devices={n}: a disaggregated stream runs in one process "
                          "for now; use rl.sampler_devices=0 (colocated) on several hosts")
    local = jax.local_devices()
    if not 0 < n < len(local):
        raise ConfigError(f"rl.sampler_devices={n} leaves no device to train on (this process "
                          f"has {len(local)}); choose 1..{len(local) - 1}, or 0 to colocate")
    return local[:-n], local[-n:]


def train_mesh(config):
    """None (plain jit) on one device; else a (data, fsdp, tensor) mesh over the trainer's
    devices (`role_devices`)."""
    devices = role_devices(config)[0]
    n = len(devices)
    data, fsdp, tensor = config.mesh.data, config.mesh.fsdp, config.mesh.tensor
    if data == -1:
        if n % (fsdp * tensor):
            raise ConfigError(f"mesh fsdp*tensor={fsdp * tensor} does not divide the {n} devices; "
                              "change mesh.fsdp / mesh.tensor")
        data = n // (fsdp * tensor)
    if data * fsdp * tensor == 1:
        return None
    return shd.make_mesh((data, fsdp, tensor), devices if n < jax.device_count() else None)


def sampling_mesh(config):
    """This process's sampler devices (`role_devices`) as `sampling.mesh` = (data, tensor)
    (ada.sharding.local_mesh; generation is process-local), or None on a single device."""
    data, tensor = config.sampling.mesh
    devices = role_devices(config)[1]
    n = len(devices)
    if data == -1:
        data = n // tensor
    if data < 1 or n % (data * tensor):
        raise ConfigError(f"sampling.mesh={tuple(config.sampling.mesh)} does not divide this "
                          f"process's {n} devices; choose (data, tensor) whose product divides "
                          f"{n} (data=-1: all of them)")
    return shd.local_mesh(data, tensor, devices) if jax.device_count() > 1 else None
