"""Write a small HDF5 checkpoint of a 1-D diffusion problem, deterministically from a seed.

python examples/quickstart/make_checkpoint.py OUT.h5 --steps 100 --seed 42
"""

from __future__ import annotations

import argparse

import h5py
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    u = rng.random(4096)
    for _ in range(args.steps):  # explicit diffusion: u += 0.25 * laplacian(u), periodic
        u = u + 0.25 * (np.roll(u, 1) - 2 * u + np.roll(u, -1))
    with h5py.File(args.out, "w") as f:
        f["fields/u"] = u
        f["step"] = np.int64(args.steps)
        f["rng/bit_generator_state"] = str(rng.bit_generator.state)


if __name__ == "__main__":
    main()
