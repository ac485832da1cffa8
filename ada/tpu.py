"""TPU chips and slices for compiling without one: each chip's peak bf16 FLOP/s, HBM and
HBM bandwidth, the slice names per chip, and a slice's compile-only devices through libtpu
(`pip install 'ada[tpu]'`), as `ada.plan` uses them."""

from __future__ import annotations

import os

# Per chip, from cloud.google.com/tpu/docs/<chip>: bf16 FLOP/s, HBM GiB, HBM bytes/s.
CHIPS = {"v4": (275e12, 32, 1200e9), "v5e": (197e12, 16, 819e9),
         "v5p": (459e12, 95, 2765e9), "v6e": (918e12, 32, 1640e9)}
# Per chip, bidirectional ICI bytes/s over all its ports: v5e 400 GB/s and v5p 1,200 GB/s as
# those pages give them; v4 (6 links) and v6e (twice v5e's, as announced) are not stated
# there in these units. The decode bound charges collectives at this rate, an optimistic one.
ICI_BYTES_PER_S = {"v4": 300e9, "v5e": 400e9, "v5p": 1200e9, "v6e": 800e9}
_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8")
TOPOLOGIES = {"v5e": _2D, "v6e": _2D, "v4": _3D, "v5p": _3D}  # v4, v5p: a device per chip


class SliceError(ValueError):
    """A slice name that is not known, or libtpu that cannot give its devices."""


class LibtpuUnavailable(SliceError):
    """libtpu is missing or cannot start, so a slice cannot compile."""


def parse_topology(name: str) -> str:
    """The chip of a known slice name ('v5e:4x4' -> 'v5e')."""
    chip, _, shape = name.partition(":")
    if shape not in TOPOLOGIES.get(chip, ()):
        known_ = "; ".join(f"{c}:{'|'.join(s)}" for c, s in TOPOLOGIES.items())
        raise SliceError(f"unknown topology {name!r}; known: {known_}")
    return chip


def tpu_devices(name: str) -> tuple[list, list]:
    """Compile-only devices of a slice, and one host's chips as a slice of their own (a
    program on part of a slice cannot compile its collectives). Up to 8 v5e / v6e chips are
    one host; other slices have 4 chips per host, as Cloud TPU VMs do."""
    chip, shape = parse_topology(name), name.partition(":")[2]
    host = "2x2x1" if chip in ("v4", "v5p") else shape if shape in _2D[:3] else "2x2"
    bounds = tuple(int(d) for d in host.split("x")) + (1,) * (chip in ("v5e", "v6e"))
    kw = dict(chip_config_name="megacore") if chip in ("v4", "v5p") else {}
    # Compiling only: share libtpu with other processes, and give it placeholders for the TPU
    # VM's variables it would otherwise complain about (the topology is named explicitly).
    for k, v in dict(ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1",
                     TPU_WORKER_HOSTNAMES="localhost", TPU_ACCELERATOR_TYPE="v5litepod-4").items():
        os.environ.setdefault(k, v)
    try:
        from jax.experimental import topologies

        slices = [list(topologies.get_topology_desc(
            platform="tpu", topology_name=f"{chip.replace('v5p', 'v5')}:{s}",
            chips_per_host_bounds=bounds, **kw).devices) for s in dict.fromkeys((shape, host))]
        return slices[0], slices[-1]
    except Exception as e:  # any failure here means libtpu is not usable
        raise LibtpuUnavailable(f"libtpu cannot load ({type(e).__name__}: "
                                f"{(str(e) or '?').splitlines()[0][:200]}); pip install "
                                "'ada[tpu]' or plan on --devices N") from None
