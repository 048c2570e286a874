"""The state codec: torch, JAX and Python state through a real HDF5 file and back, with
types and bits kept; one-line errors for what cannot be stored; hostile trees refused."""

from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import ml_dtypes
import numpy as np
import pytest
import torch

from kronos_audit.checkpoint.codec import tree
from kronos_audit.checkpoint.codec.torch import TORCH_BITS, TORCH_NUMPY
from kronos_audit.checkpoint.hdf5 import read_flat, text_array, write_hdf5
from kronos_audit.errors import CheckpointError, UsageError


def through_file(tmp_path: Path, state: Any, *, like: Any = None) -> dict[str, Any]:
    """encode, write with the checkpoint writer, read back as a checkpoint is read, decode."""
    path = tmp_path / f"state-{time.monotonic_ns()}.h5"
    write_hdf5(path, tree.encode(state))
    return tree.decode(read_flat(path), like=like, where=str(path))


def file_of(tmp_path: Path, state: Any) -> dict[str, Any]:
    path = tmp_path / f"flat-{time.monotonic_ns()}.h5"
    write_hdf5(path, tree.encode(state))
    return read_flat(path)


UINTS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def bits_of(t: torch.Tensor) -> bytes:
    """The tensor's bits in C order (no torch copy: sub-byte dtypes have no copy kernel)."""
    t = t.detach()
    if t.dtype.itemsize in UINTS:
        t = t.view(UINTS[t.dtype.itemsize])
    return bytes(t.numpy().tobytes())


def assert_same_tensors(a: Any, b: Any, where: str = "") -> None:
    """Equal structure, types, dtypes and bits (tensors compared bitwise)."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, where
        assert a.shape == b.shape, where
        assert bits_of(a) == bits_of(b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same_tensors(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tensors(x, y, f"{where}/{i}")
    else:
        assert a == b, where


# -- torch ------------------------------------------------------------------------------------


def trained() -> tuple[torch.nn.Module, Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.99))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched, scaler


def test_a_torch_training_state_round_trips_with_types_and_bits(tmp_path: Path) -> None:
    model, opt, sched, scaler = trained()
    state = {"model": model, "opt": opt, "sched": sched, "scaler": scaler}
    back = through_file(tmp_path, state)

    # Without a template: the state dicts, with their types.
    sd = back["model"]
    assert type(sd) is collections.OrderedDict
    # BatchNorm's version lives in _metadata, an attribute torch sets on its OrderedDict
    assert getattr(sd, "_metadata") == getattr(model.state_dict(), "_metadata")  # noqa: B009
    assert list(sd) == list(model.state_dict())
    assert_same_tensors(dict(sd), dict(model.state_dict()))
    assert sd["1.num_batches_tracked"].dtype == torch.int64
    osd = back["opt"]
    assert sorted(osd["state"]) == [0, 1, 2, 3, 4, 5]  # int keys stay ints
    assert all(type(k) is int for k in osd["state"])
    group = osd["param_groups"][0]
    assert group["betas"] == (0.8, 0.99)
    assert type(group["betas"]) is tuple
    assert group["foreach"] is None
    assert group["fused"] is None
    assert group["amsgrad"] is False
    assert type(group["lr"]) is float
    assert_same_tensors(osd, opt.state_dict())
    assert back["sched"] == sched.state_dict()
    assert back["scaler"] == scaler.state_dict()

    # Into fresh objects, in place.
    model2, opt2, sched2, scaler2 = (
        m := torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        ),
        o := torch.optim.AdamW(m.parameters(), lr=1.0),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
        torch.amp.GradScaler("cpu"),
    )
    like = {"model": model2, "opt": opt2, "sched": sched2, "scaler": scaler2}
    loaded = through_file(tmp_path, state, like=like)
    assert loaded["model"] is model2
    assert loaded["opt"] is opt2
    assert loaded["sched"] is sched2
    assert_same_tensors(dict(model2.state_dict()), dict(model.state_dict()))
    assert_same_tensors(opt2.state_dict(), opt.state_dict())
    assert sched2.state_dict() == sched.state_dict()
    assert scaler2.state_dict() == scaler.state_dict()
    # The loaded optimizer goes on exactly as the original does.
    x = torch.randn(5, 4)
    for net, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        net(x).pow(2).sum().backward()
        o.step()
    assert_same_tensors(dict(model2.state_dict()), dict(model.state_dict()))


TORCH_DTYPES = [*TORCH_NUMPY, *TORCH_BITS]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_every_torch_dtype_round_trips_bitwise(tmp_path: Path, name: str) -> None:
    dtype = getattr(torch, name)
    raw = torch.randint(0, 256, (3, 5 * dtype.itemsize), dtype=torch.uint8)
    t = raw.view(dtype) if dtype != torch.bool else raw.bool()
    state = {"t": t, "col": t[:, 1], "zero_d": t[0, 0]}
    flat = tree.encode(state)
    back = through_file(tmp_path, state)
    for key, value in state.items():
        got = back[key]
        assert type(got) is torch.Tensor
        assert got.dtype == dtype
        assert got.shape == value.shape
        assert bits_of(got) == bits_of(value), (name, key)
    if name in TORCH_BITS:  # HDF5 has no such type: the bits, unsigned
        assert flat["/t"].dtype == np.dtype(f"uint{8 * dtype.itemsize}")


def test_bfloat16_is_stored_as_its_bits_and_hashed_as_read(tmp_path: Path) -> None:
    t = torch.tensor([1.5, -2.25, float("inf")], dtype=torch.bfloat16)
    path = tmp_path / "bf.h5"
    write_hdf5(path, tree.encode({"w": t, "h": t.half()}))
    with h5py.File(path) as f:
        assert f["w"].dtype == np.uint16
        assert f["w"][()].tolist() == t.view(torch.uint16).tolist()
        assert f["h"].dtype == np.float16  # HDF5 has float16: stored as it is
    back = tree.decode(read_flat(path))
    assert back["w"].dtype == torch.bfloat16
    assert torch.equal(back["w"], t)
    assert back["h"].dtype == torch.float16
    assert torch.equal(back["h"], t.half())


def test_parameters_conjugates_and_views(tmp_path: Path) -> None:
    p = torch.nn.Parameter(torch.randn(2, 3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    c = torch.randn(3, dtype=torch.complex64)
    back = through_file(
        tmp_path,
        {"p": p, "frozen": frozen, "conj": c.conj(), "t": p.detach().t(), "g": p * 2},
    )
    assert isinstance(back["p"], torch.nn.Parameter)
    assert back["p"].requires_grad
    assert torch.equal(back["p"].detach(), p.detach())
    assert isinstance(back["frozen"], torch.nn.Parameter)
    assert not back["frozen"].requires_grad
    assert torch.equal(back["conj"], c.conj().resolve_conj())
    assert torch.equal(back["t"], p.detach().t())
    assert type(back["g"]) is torch.Tensor
    assert back["g"].requires_grad


def test_encode_shares_memory_with_every_tensor() -> None:
    sd = collections.OrderedDict((f"layer{i}.weight", torch.randn(8, 8)) for i in range(1000))
    w = torch.randn(64, 64)
    a = np.ones(1000)
    flat = tree.encode({"w": w, "a": a, "m": sd})
    assert np.shares_memory(flat["/w"], w.numpy())  # the run's staging buffers copy, once
    assert np.shares_memory(flat["/a"], a)
    # not one of a thousand tensors is copied on the way
    assert all(np.shares_memory(flat[f"/m/{k}"], t.numpy()) for k, t in sd.items())


def test_a_tensor_template_gives_its_dtype(tmp_path: Path) -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    back = through_file(
        tmp_path,
        {"t": t, "n": np.arange(3, dtype=np.int64)},
        like={"t": torch.zeros(2, 3, dtype=torch.float64), "n": torch.zeros(3, dtype=torch.int32)},
    )
    assert back["t"].dtype == torch.float64
    assert torch.equal(back["t"], t.double())
    assert back["n"].dtype == torch.int32
    assert back["n"].tolist() == [0, 1, 2]


def test_template_keys_missing_from_the_checkpoint_are_named(tmp_path: Path) -> None:
    model, *_ = trained()
    bigger = torch.nn.Sequential(model, torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=r"state /model/weight: the template has it"):
        through_file(tmp_path, {"model": {"w": 1}}, like={"model": {"w": 0, "weight": 0}})
    with pytest.raises(CheckpointError, match=r"state /m: Sequential.load_state_dict failed"):
        through_file(tmp_path, {"m": model}, like={"m": torch.nn.Sequential(torch.nn.Linear(9, 9))})
    # torch says what is wrong on the lines after its first: they are in the one line too
    with pytest.raises(CheckpointError, match=r"failed: Error.*size mismatch for weight") as e:
        through_file(tmp_path, {"m": torch.nn.Linear(3, 2)}, like={"m": torch.nn.Linear(2, 2)})
    assert "\n" not in str(e.value)
    # A template that lacks keys the checkpoint has: those are dropped (a partial restore).
    back = through_file(tmp_path, {"a": 1, "b": 2, "big": bigger}, like={"a": 0})
    assert back == {"a": 1}


# -- JAX --------------------------------------------------------------------------------------


def test_an_optax_state_round_trips_with_its_types(tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    params = {
        "w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
        "b": jnp.ones(3, jnp.bfloat16) * 1.5,
    }
    opt = optax.adamw(1e-3)
    opt_state = opt.init(params)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    _, opt_state = opt.update(grads, opt_state, params)
    key = jax.random.key(7)
    state = {"params": params, "opt": opt_state, "key": key, "keys": jax.random.split(key, 3)}
    back = through_file(tmp_path, state)

    assert str(jax.tree_util.tree_structure(back["opt"])) == str(
        jax.tree_util.tree_structure(opt_state)
    )
    assert type(back["opt"][0]).__name__ == "ScaleByAdamState"
    assert type(back["opt"][0]) is type(opt_state[0])  # optax is imported: its own class
    assert type(back["opt"][1]) is optax.EmptyState
    for got, want in zip(
        jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(state), strict=True
    ):
        assert isinstance(got, jax.Array)
        assert got.dtype == want.dtype
        if jax.numpy.issubdtype(want.dtype, jax.dtypes.prng_key):
            assert str(jax.random.key_impl(got)) == str(jax.random.key_impl(want))
            np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))
        else:
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert back["params"]["b"].dtype == jnp.bfloat16
    # The same draws from the restored key.
    np.testing.assert_array_equal(
        jax.random.normal(back["key"], (4,)), jax.random.normal(key, (4,))
    )
    # Into a template: its types, dtypes and shardings.
    like = {"params": params, "opt": opt.init(params), "key": jax.random.key(0), "keys": None}
    fitted = through_file(tmp_path, state, like=like)
    assert type(fitted["opt"][0]) is type(opt_state[0])
    np.testing.assert_array_equal(jax.random.key_data(fitted["key"]), jax.random.key_data(key))
    assert fitted["params"]["b"].sharding == params["b"].sharding


def test_a_registered_dataclass_node_round_trips(tmp_path: Path) -> None:
    import jax.numpy as jnp

    from tests.checkpoint.jax_state import TrainState

    ts = TrainState(params={"w": jnp.ones(2)}, step=jnp.int32(3), name="custom")
    back = through_file(tmp_path, {"ts": ts})
    assert type(back["ts"]) is TrainState  # built from its children (static: the default)
    np.testing.assert_array_equal(back["ts"].params["w"], np.ones(2))
    like = TrainState(params={"w": jnp.zeros(2)}, step=jnp.int32(0), name="custom")
    fitted = through_file(tmp_path, {"ts": ts}, like={"ts": like})
    assert type(fitted["ts"]) is TrainState
    assert fitted["ts"].name == "custom"
    assert int(fitted["ts"].step) == 3
    flat = tree.encode({"ts": ts})
    assert {"/ts/params/w", "/ts/step"} <= set(flat)


def test_numpy_ml_dtypes_are_stored_as_bits(tmp_path: Path) -> None:
    a = np.array([1.0, -0.5, 3.0], dtype=ml_dtypes.bfloat16)
    f8 = np.array([0.5, 2.0], dtype=ml_dtypes.float8_e4m3fn)
    back = through_file(tmp_path, {"a": a, "f8": f8, "s": a[0]})
    assert back["a"].dtype == a.dtype
    assert back["a"].tobytes() == a.tobytes()
    assert back["f8"].dtype == f8.dtype
    assert back["f8"].tobytes() == f8.tobytes()
    assert type(back["s"]) is type(a[0])
    assert back["s"] == a[0]


# -- Python values and containers -------------------------------------------------------------


class Point(NamedTuple):
    x: Any
    y: Any


def test_python_values_and_containers_keep_their_types(tmp_path: Path) -> None:
    od = collections.OrderedDict([("z", 1), ("a", 2), ("m", 3)])
    state = {
        "keys": {1: "int", "1": "str", None: "none", 2.5: "float", (1, "x"): "tuple", False: 0},
        "huge": 2**200,
        "neg": -(2**100),
        "edge": 2**63,
        "bytes": b"ab\0\0",
        "empty_bytes": b"",
        "od": od,
        "empty": {"d": {}, "l": [], "t": (), "ll": [[]], "dd": {"x": {}}},
        "scalars": [True, 3, 1.5, 2 + 1j, "héllo", "", None],
        "np": [np.float32(1.5), np.int16(-3), np.array(7), np.bool_(True)],
        "point": Point(1, [2.0, Point("a", None)]),
        "nested": ({"a": [1, (2, 3)]},),
    }
    back = through_file(tmp_path, state)
    assert back == state
    keys: dict[Any, str] = state["keys"]  # type: ignore[assignment]
    assert list(back["keys"]) == list(keys)
    assert [type(k) for k in back["keys"]] == [type(k) for k in keys]
    assert type(back["od"]) is collections.OrderedDict
    assert list(back["od"]) == ["z", "a", "m"]
    assert [type(v) for v in back["scalars"]] == [bool, int, float, complex, str, str, type(None)]
    assert [type(v) for v in back["np"]] == [np.float32, np.int16, np.ndarray, np.bool_]
    assert back["np"][2].shape == ()
    assert type(back["point"]) is Point
    assert type(back["point"].y[1]) is Point
    assert type(back["nested"]) is tuple
    assert type(back["nested"][0]["a"][1]) is tuple
    assert back["bytes"] == b"ab\0\0"
    assert back["empty_bytes"] == b""
    assert tree.state_digest(back) == tree.state_digest(state)


def test_a_plain_state_keeps_its_layout_and_old_files_still_read(tmp_path: Path) -> None:
    u = np.arange(4.0)
    flat = tree.encode({"fields": {"u": u}, "t": 0.5, "label": "heat"})
    assert set(flat) == {"/fields/u", "/t", "/label", tree.TREE_PATH}
    # A checkpoint written before the tree existed: nested by path, as it always was.
    old = {"/fields/u": u, "/t": np.float64(0.5), "/label": "heat"}
    back = tree.decode(old)
    assert back["label"] == "heat"
    assert type(back["t"]) is np.float64
    np.testing.assert_array_equal(back["fields"]["u"], u)


def test_names_that_are_not_valid_hdf5_names_are_escaped_and_kept(tmp_path: Path) -> None:
    state = {"a/b": 1, "": 2, ".": 3, "..": 4, "x\0y": 5, "a%2Fb": 6, "ünï": 7}
    flat = tree.encode(state)
    assert all(p.count("/") == 1 for p in flat if p != tree.TREE_PATH)
    assert through_file(tmp_path, state) == state


# -- what cannot be stored --------------------------------------------------------------------


class Unreadable(torch.Tensor):
    """A tensor whose memory cannot be had, on the CPU or not, and whose error says nothing
    (as a device's driver may raise)."""

    def numpy(self, *, force: bool = False) -> np.ndarray:
        raise RuntimeError()

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError()


def test_what_cannot_be_stored_is_one_line_naming_the_path(tmp_path: Path) -> None:
    def refused(state: Any) -> str:
        with pytest.raises(UsageError) as info:
            tree.encode(state)
        message = str(info.value)
        assert "\n" not in message
        return message

    assert refused({"opt": {"fn": lambda x: x}}) == (
        "state /opt/fn: a function cannot be stored; use arrays, tensors, numbers, strings, "
        "containers of them or objects with state_dict()"
    )
    with open(tmp_path / "f", "w") as f:
        assert refused({"a": [1, f]}).startswith("state /a/1: a TextIOWrapper cannot be stored;")
    assert refused({"o": object()}).startswith("state /o: an object cannot be stored;")
    cycle: dict[str, Any] = {"x": 1}
    cycle["self"] = {"again": cycle}
    assert refused({"c": cycle}).startswith("state /c/self/again: the state contains itself")
    loop: list[Any] = []
    loop.append(loop)
    assert refused({"l": loop}).startswith("state /l/0: the state contains itself")
    assert refused({"k": {b"x": 1}}).startswith("state /k/b'x': a key of type bytes")
    assert refused({"rng": 1}) == "state key 'rng' is reserved for kaudit's own records"
    assert refused({"kaudit": 1}) == "state key 'kaudit' is reserved for kaudit's own records"
    assert "sparse_coo tensor cannot be stored" in refused({"s": torch.eye(2).to_sparse()})
    assert "meta tensor cannot be stored" in refused({"s": torch.empty(2, device="meta")})
    # A tensor that cannot be read, for a reason torch gives no words to: its type named.
    unreadable = torch.zeros(2).as_subclass(Unreadable)
    assert refused({"s": unreadable}) == "state /s: this tensor cannot be read: RuntimeError"
    assert refused({"u": np.array(["x"])}).startswith("state /u: dtype <U1 cannot be stored")
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(tree.MAX_DEPTH + 5):
        node["d"] = {}
        node = node["d"]
    assert "nested more than" in refused(deep)


# -- hostile trees ----------------------------------------------------------------------------


def with_tree(flat: dict[str, Any], nodes_or_text: Any) -> dict[str, Any]:
    text = nodes_or_text
    if not isinstance(text, str):
        text = json.dumps({"format": tree.FORMAT, "version": tree.VERSION, "nodes": text})
    return {**flat, tree.TREE_PATH: text}


def refused_tree(flat: dict[str, Any], nodes_or_text: Any) -> str:
    with pytest.raises(CheckpointError) as info:
        tree.decode(with_tree(flat, nodes_or_text), where="x.h5")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_hostile_trees_are_refused_in_one_line(tmp_path: Path) -> None:
    flat = file_of(tmp_path, {"w": torch.ones(2, dtype=torch.bfloat16), "n": 1})
    nodes = json.loads(flat[tree.TREE_PATH])["nodes"]
    assert "not valid JSON" in refused_tree(flat, "{not json")
    assert "duplicate" in refused_tree(flat, '{"format": 1, "format": 2}').lower()
    assert "not a kaudit state tree" in refused_tree(flat, "[]")
    bad_kind = [nodes[0], {"kind": "pickle"}, nodes[2]]
    assert "unknown node kind 'pickle'" in refused_tree(flat, bad_kind)
    missing = [{**nodes[0], "items": [["w", "nowhere", 1], ["n", "n", 2]]}, *nodes[1:]]
    assert "state /nowhere: the tree names a dataset the file does not have" in refused_tree(
        flat, missing
    )
    twice = [{**nodes[0], "items": [["w", "w", 1], ["v", "w", 2]]}, *nodes[1:]]
    assert "used twice" in refused_tree(flat, twice)
    backwards = [{**nodes[0], "items": [["w", "w", 0]]}]
    assert "bad node reference 0" in refused_tree(flat, backwards)
    wrong_type = [nodes[0], {"kind": "torch", "dtype": "float32"}, nodes[2]]
    assert "state /w: a torch float32 tensor stored as uint16" in refused_tree(flat, wrong_type)
    not_a_dtype = [nodes[0], {"kind": "torch", "dtype": "__class__"}, nodes[2]]
    assert "unknown torch dtype" in refused_tree(flat, not_a_dtype)
    escape = [{**nodes[0], "items": [["w", "..", 1], ["n", "n", 2]]}, *nodes[1:]]
    assert "bad dataset name '..'" in refused_tree(flat, escape)
    reserved = [{**nodes[0], "items": [["w", "rng", 1], ["n", "n", 2]]}, *nodes[1:]]
    assert "state /" in refused_tree(flat, reserved)
    unreached = [*nodes, {"kind": "none"}]
    assert "1 nodes are not reached" in refused_tree(flat, unreached)
    deep: list[dict[str, Any]] = [{"kind": "dict", "type": "dict", "items": [["d", "d", 1]]}]
    deep += [{"kind": "list", "items": [i + 2]} for i in range(tree.MAX_DEPTH + 3)] + [
        {"kind": "none"}
    ]
    assert "nested more than" in refused_tree(flat, deep)
    assert "/kaudit/tree" in refused_tree({**flat}, "x" * 10)
    wide = [
        {"kind": "dict", "type": "dict", "items": [["p", "p", 1]]},
        {
            "kind": "namedtuple",
            "module": "nowhere",
            "qualname": "P",
            "fields": [f"f{i}" for i in range(1001)],
            "items": list(range(2, 1003)),
        },
        *[{"kind": "none"}] * 1001,
    ]
    assert "too many NamedTuple fields" in refused_tree(flat, wide)
    with pytest.raises(CheckpointError, match="expected JSON text"):
        tree.decode({**flat, tree.TREE_PATH: np.zeros(3)})


def test_a_class_named_in_the_tree_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.checkpoint.jax_state import TrainState

    marker = tmp_path / "imported"
    (tmp_path / "kaudit_evil_module.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Point(tuple):\n    _fields = ('x', 'y')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    flat = file_of(tmp_path, {"p": Point(1, 2.5), "t": TrainState({"w": 1}, 2)})
    nodes = json.loads(flat[tree.TREE_PATH])["nodes"]
    for node in nodes:
        if node["kind"] in ("namedtuple", "pytree"):
            node["module"] = "kaudit_evil_module"
    back = tree.decode(with_tree(flat, nodes))
    assert "kaudit_evil_module" not in sys.modules
    assert not marker.exists()
    assert back["p"] == (1, 2.5)
    assert back["p"].x == 1
    assert type(back["p"]).__name__ == "Point"
    assert type(back["p"]) is not Point
    assert back["t"] == {"params": {"w": 1}, "step": 2}  # an unknown pytree: its children
    # A class that is there but is not what the tree says is not used either.
    for node in nodes:
        if node["kind"] == "namedtuple":
            node["module"], node["qualname"] = "collections", "OrderedDict"
    back = tree.decode(with_tree(flat, nodes))
    assert type(back["p"]) is not collections.OrderedDict
    assert back["p"].y == 2.5


def test_a_missing_framework_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    flat: dict[str, Any] = dict(tree.encode({"w": torch.ones(2)}))
    flat[tree.TREE_PATH] = flat[tree.TREE_PATH].item().decode()  # as h5py reads it
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(CheckpointError, match=r"state /w: .*install kronos-audit\[torch\]"):
        tree.decode(flat)


def test_text_array_is_what_a_str_leaf_becomes() -> None:
    flat = tree.encode({"s": "abc"})
    assert flat["/s"].dtype == text_array("abc").dtype


class Counter:
    """A Stateful object of a newer version: its state dict gained a key."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.added = 0
        self.given: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "added": self.added, "w": torch.zeros(2, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.given = state
        self.n = state["n"]
        self.added = state.get("added", -1)


def test_a_stateful_object_gets_the_checkpoints_state_dict_as_it_is(tmp_path: Path) -> None:
    old = {"n": 7, "legacy": "kept", "w": torch.ones(2, dtype=torch.float32)}  # older version
    counter = Counter()
    back = through_file(tmp_path, {"c": old}, like={"c": counter})
    assert back["c"] is counter
    assert counter.n == 7
    assert counter.added == -1  # absent from the checkpoint: load_state_dict decides
    assert list(counter.given) == ["n", "legacy", "w"]  # nothing added, nothing dropped
    assert counter.given["w"].dtype == torch.float64  # placed as its own state_dict() has it


def test_a_string_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("s", data=np.array(b"\xff\xfe", dtype=h5py.string_dtype("utf-8", 2)))
    with pytest.raises(CheckpointError, match=r"bad\.h5: dataset /s: not UTF-8 text$"):
        read_flat(path)
