"""The run's random generators: seeded when the run starts, saved with each checkpoint,
restored with it.

A checkpoint's ``/rng`` group holds, each under its own dataset:

=========================  =============================================================
``/rng/numpy``             ``run.rng``'s bit generator state (JSON text)
``/rng/python``            Python's ``random`` (JSON text of ``random.getstate()``)
``/rng/numpy_global``      numpy's legacy global generator (``np.random.rand`` and the
                           rest of ``np.random.*``; JSON text of ``np.random.get_state()``)
``/rng/torch/cpu``         torch's default CPU generator (``torch.get_rng_state()``, uint8),
                           only when the program imported torch
``/rng/torch/cuda/<i>``    CUDA device ``i``'s default generator, only for devices that
                           were initialized (``torch.cuda.is_initialized()``)
=========================  =============================================================

Checkpoints written before ``numpy_global`` and torch were added hold only the first two;
they restore as they always did. Nothing here imports torch: a program that did not import
it has no torch generator to save, seed or restore (``sys.modules`` tells).

JAX has no global generator: its random state is the key arrays the program passes
around, which are part of the state it checkpoints (``jax.random.key`` arrays are stored
like any other array), so there is nothing for this module to capture.
"""

from __future__ import annotations

import functools
import json
import random
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit._internal import strictjson
from kronos_audit.checkpoint.codec.format import RNG_GROUP
from kronos_audit.checkpoint.hdf5 import text_array
from kronos_audit.errors import CheckpointError

# Spawn keys of the seeds derived from the run seed: two words, so that they can never be
# those of a Monte Carlo batch (kronos_audit.runtime.campaigns.ledger.batch_rng uses one word, the
# batch index) nor run.rng's own (no spawn key).
_SPAWN_TAG = 0x6B61_7564  # "kaud"
_NUMPY_GLOBAL_KEY = (_SPAWN_TAG, 0)
_TORCH_KEY = (_SPAWN_TAG, 1)


class RngNotRestored(UserWarning):
    """A checkpoint holds generator states this process cannot take (CUDA devices this
    machine lacks): those generators keep the values the run seeded them with, and the
    resumed run's draws from them differ from an uninterrupted run's."""


def derived_seed(seed: int, spawn_key: tuple[int, ...], *, bits: int) -> int:
    """A ``bits``-bit seed (32 or 63) for one generator, a function of the run seed and
    ``spawn_key`` only: distinct generators get uncorrelated streams."""
    sequence = np.random.SeedSequence(seed, spawn_key=spawn_key)
    if bits == 32:
        return int(sequence.generate_state(1, dtype=np.uint32)[0])
    return int(sequence.generate_state(1, dtype=np.uint64)[0]) >> (64 - bits)


def seed_all(seed: int) -> None:
    """Seed the process-global generators from the run seed: Python's ``random`` (with the
    seed itself, as kaudit always has), numpy's legacy global generator and, when the
    program imported torch, torch's (CPU and every CUDA device: ``torch.manual_seed``).

    ``run.rng`` is seeded by the run itself; JAX has no global generator to seed.
    """
    random.seed(seed)
    np.random.seed(derived_seed(seed, _NUMPY_GLOBAL_KEY, bits=32))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(derived_seed(seed, _TORCH_KEY, bits=63))


def _dataset(*parts: str) -> str:
    return "/" + "/".join((RNG_GROUP, *parts))


def capture(rng: np.random.Generator) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, Any]]:
    """The generators' states now: ``(datasets, record)``, the datasets to write (path to
    array) and the manifest's ``rng`` record naming each generator's dataset.

    Call it on the loop thread when the step's state is taken: the states must be those
    at that step. It is small (torch's CPU state is 5 KB; numpy's global one 7 KB of text).
    """
    py_version, py_internal, py_gauss = random.getstate()
    bit_generator = rng.bit_generator.state
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)  # legacy=True always gives the tuple form
    name, keys, pos, has_gauss, cached_gaussian = legacy
    datasets: dict[str, np.ndarray[Any, Any]] = {
        _dataset("numpy"): text_array(json.dumps(bit_generator)),
        _dataset("python"): text_array(json.dumps([py_version, list(py_internal), py_gauss])),
        _dataset("numpy_global"): text_array(
            json.dumps([name, [int(k) for k in keys], int(pos), int(has_gauss), cached_gaussian])
        ),
    }
    record: dict[str, Any] = {
        "numpy": {"dataset": _dataset("numpy"), "bit_generator": bit_generator["bit_generator"]},
        "python": {"dataset": _dataset("python")},
        "numpy_global": {"dataset": _dataset("numpy_global"), "bit_generator": str(name)},
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        datasets[_dataset("torch", "cpu")] = torch.get_rng_state().numpy()
        record["torch"] = {"dataset": _dataset("torch", "cpu")}
        # Only initialized devices: asking an uninitialized one would initialize CUDA (and
        # take its memory) in a program that never used it.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for i, state in enumerate(torch.cuda.get_rng_state_all()):
                datasets[_dataset("torch", "cuda", str(i))] = state.numpy()
                record[f"torch.cuda:{i}"] = {"dataset": _dataset("torch", "cuda", str(i))}
    return datasets, record


def _text(value: Any, where: str, path: Path) -> Any:
    """The JSON a text dataset holds."""
    if isinstance(value, bytes | np.bytes_):
        value = bytes(value).decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise CheckpointError(f"{where}: a generator state must be JSON text", path=path)
    try:
        return strictjson.loads(value)
    except strictjson.Refused:
        raise CheckpointError(f"{where}: a generator state must be JSON text", path=path) from None


def _bytes(value: Any, where: str, path: Path) -> np.ndarray[Any, Any]:
    if not (isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1):
        raise CheckpointError(f"{where}: a torch generator state must be uint8 bytes", path=path)
    return np.ascontiguousarray(value)


# What a malformed state makes the setters raise: a wrong type, length, value or shape.
_BAD_STATE = (ValueError, TypeError, KeyError, IndexError, OverflowError, RuntimeError)


def restore(rng: np.random.Generator, stored: Any, *, path: Path, stacklevel: int = 2) -> None:
    """Put back each generator ``stored`` (the checkpoint's ``/rng`` group, as nested
    mappings) holds; raise :class:`CheckpointError` naming the dataset of a malformed one,
    having changed no generator (each state is tried on a scratch generator first).

    torch's generators are restored only when the program imported torch (a program that
    does not use it has none to restore, and this never imports it). CUDA device states
    this machine has no device for are skipped with one :class:`RngNotRestored` warning.
    """
    if not isinstance(stored, Mapping):
        raise CheckpointError(f"/{RNG_GROUP}: must be a group", path=path)
    steps: list[Callable[[], None]] = []
    if "numpy" in stored:
        steps.append(_numpy(rng, stored["numpy"], path))
    if "python" in stored:
        steps.append(_python(stored["python"], path))
    if "numpy_global" in stored:
        steps.append(_numpy_global(stored["numpy_global"], path))
    torch = sys.modules.get("torch")
    held = stored.get("torch")
    missing: list[int] = []
    count = 0
    if torch is not None and held is not None:
        if not isinstance(held, Mapping):
            raise CheckpointError(f"{_dataset('torch')}: must be a group", path=path)
        if "cpu" in held:
            steps.append(_torch_cpu(torch, held["cpu"], path))
        if held.get("cuda") is not None:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            cuda, missing = _torch_cuda(torch, held["cuda"], count, path)
            steps.extend(cuda)
    for step in steps:
        step()
    if missing:
        devices = ", ".join(f"cuda:{d}" for d in missing)
        warnings.warn(
            f"{path}: the generator states of {devices} were not restored: this machine has "
            f"{count} CUDA device{'' if count == 1 else 's'}; those generators keep their "
            "seeded values, so draws from them differ from an uninterrupted run's",
            RngNotRestored,
            stacklevel=stacklevel,
        )


def _numpy(rng: np.random.Generator, value: Any, path: Path) -> Callable[[], None]:
    where = _dataset("numpy")
    state = _text(value, where, path)
    kind = type(rng.bit_generator)
    try:
        kind().state = state  # a fresh one, seeded from the OS: only the setter matters
    except _BAD_STATE as e:
        raise CheckpointError(
            f"{where}: not a state of run.rng's {kind.__name__}: {e}", path=path
        ) from None

    def apply() -> None:
        rng.bit_generator.state = state

    return apply


def _python(value: Any, path: Path) -> Callable[[], None]:
    where = _dataset("python")
    try:
        version, internal, gauss = _text(value, where, path)
        state = (version, tuple(internal), gauss)
        random.Random().setstate(state)
    except _BAD_STATE as e:
        raise CheckpointError(f"{where}: not a state of Python's random: {e}", path=path) from None
    return lambda: random.setstate(state)


def _numpy_global(value: Any, path: Path) -> Callable[[], None]:
    where = _dataset("numpy_global")
    try:
        name, keys, pos, has_gauss, cached_gaussian = _text(value, where, path)
        state = (
            str(name),
            np.asarray(keys, dtype=np.uint32),
            int(pos),
            int(has_gauss),
            float(cached_gaussian),
        )
        np.random.RandomState().set_state(state)
    except _BAD_STATE as e:
        raise CheckpointError(
            f"{where}: not a state of numpy's global generator: {e}", path=path
        ) from None
    return lambda: np.random.set_state(state)


def _torch_cpu(torch: Any, value: Any, path: Path) -> Callable[[], None]:
    where = _dataset("torch", "cpu")
    state = torch.from_numpy(_bytes(value, where, path).copy())
    try:
        torch.Generator().set_state(state)
    except _BAD_STATE as e:
        raise CheckpointError(f"{where}: not a torch generator state: {e}", path=path) from None
    return lambda: torch.set_rng_state(state)


def _set_cuda(torch: Any, state: np.ndarray[Any, Any], device: int) -> None:
    torch.cuda.set_rng_state(torch.from_numpy(state.copy()), device)


def _torch_cuda(
    torch: Any, held: Any, count: int, path: Path
) -> tuple[list[Callable[[], None]], list[int]]:
    """The steps that restore the CUDA devices' states, and the devices this machine
    lacks."""
    if not isinstance(held, Mapping) or not all(
        isinstance(k, str) and k.isdigit() and k.isascii() for k in held
    ):
        raise CheckpointError(
            f"{_dataset('torch', 'cuda')}: must be a group of device numbers", path=path
        )
    steps: list[Callable[[], None]] = []
    missing: list[int] = []
    for name in sorted(held, key=int):
        device = int(name)
        state = _bytes(held[name], _dataset("torch", "cuda", name), path)
        if device >= count:
            missing.append(device)
        else:
            # Not tried first: a scratch CUDA generator would initialize CUDA here.
            steps.append(functools.partial(_set_cuda, torch, state, device))
    return steps, missing
