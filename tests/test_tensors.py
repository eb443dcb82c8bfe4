"""torch tensors and parameters through blpickle: typed out-of-band storages, shared storages
and views, safe loading, hostile arguments to the rebuild functions, blpickle.open by name."""

from __future__ import annotations

import pickle
from collections import OrderedDict

import numpy as np
import pytest
from test_record import Counting

import blpickle
from blpickle.errors import CorruptError
from blpickle.tensors import TORCH_DTYPES, map_location, rebuild_parameter, rebuild_storage, rebuild_tensor

torch = pytest.importorskip("torch")

DTYPES = [name for name in TORCH_DTYPES if hasattr(torch, name)]
#: Elements enough for a 1-byte dtype's storage to go out of band (64 KiB and over).
OUT_OF_BAND = 256 * 300


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A tensor of ``dtype`` whose bytes are random (every bit pattern, bools 0 or 1)."""
    generator = torch.Generator().manual_seed(seed)
    count = int(np.prod(shape))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    data = torch.randint(0, 256, (count * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    return data.view(dtype).reshape(shape)


def weights(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return 0.02 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def same_bytes(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """Whether two tensors have the same type, dtype, shape and bytes."""
    if type(actual) is not type(expected) or actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    return torch.equal(expected.reshape(-1).view(torch.uint8), actual.reshape(-1).view(torch.uint8))


def shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("count", [100, OUT_OF_BAND])  # in band, out of band
@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips_bit_for_bit(name, count):
    tensor = random_tensor(getattr(torch, name), (count // 100, 100))
    data = blpickle.dumps({"t": tensor})
    assert same_bytes(tensor, blpickle.loads(data)["t"])
    if count == OUT_OF_BAND:
        with blpickle.open(data) as rec:
            (info,) = rec.arrays
            assert info.tensor == f"torch.{name}" and info.dtype == np.dtype(TORCH_DTYPES[name])
            assert rec.info.buffers[0].itemsize == tensor.element_size()  # typed for the shuffle filter
            assert same_bytes(tensor, rec["t"])


def test_weights_are_compressed_at_their_element_size():
    state = {"fp32": weights((512, 512)), "bf16": weights((512, 512), 1).to(torch.bfloat16)}
    with blpickle.open(blpickle.dumps(state)) as rec:
        ratios = {a.name: a.nbytes / a.stored for a in rec.arrays}
        assert [a.codec for a in rec.arrays] == ["zstd", "zstd"]
    assert ratios["fp32"] > 1.15 and ratios["bf16"] > 1.4, ratios


def test_a_tensor_its_views_and_reshaped_aliases_are_stored_once_and_shared():
    base = weights((1024, 1024))
    obj = {"base": base, "rows": base[10:20], "strided": base[::2, 1::3], "flat": base.reshape(-1), "t": base.T}
    data = blpickle.dumps(obj)
    assert len(data) <= 1.05 * base.numel() * base.element_size()
    loaded = blpickle.loads(data)
    for key, tensor in obj.items():
        assert same_bytes(tensor, loaded[key])
        assert loaded[key].stride() == tensor.stride()
        assert loaded[key].storage_offset() == tensor.storage_offset()
        assert shares(loaded[key], loaded["base"])
    loaded["base"][10, 4] = 7.0
    assert loaded["rows"][0, 4] == 7.0 and loaded["flat"][10 * 1024 + 4] == 7.0


def test_a_storage_met_first_through_a_view_is_stored_whole_and_unnamed():
    base = weights((512, 256))
    with blpickle.open(blpickle.dumps({"view": base[100:], "base": base})) as rec:
        (info,) = rec.arrays
        assert info.name is None and info.shape == (512 * 256,)  # the whole storage, flat
        with pytest.raises(KeyError, match="sharing the storage of a tensor met before it"):
            rec["base"]
        loaded = rec.load()
    assert same_bytes(base, loaded["base"]) and shares(loaded["base"], loaded["view"])


def test_tensors_of_other_dtypes_over_one_storage_share_it():
    base = weights((256, 256))
    obj = {"floats": base, "bits": base.view(torch.int32), "bytes": base.view(torch.uint8)}
    loaded = blpickle.loads(blpickle.dumps(obj))
    assert all(same_bytes(obj[key], loaded[key]) and shares(loaded[key], loaded["floats"]) for key in obj)


def test_parameters_come_back_as_parameters_with_requires_grad_and_tied_ones_tied():
    tied = torch.nn.Parameter(weights((256, 256)))
    frozen = torch.nn.Parameter(weights((256, 256), 1), requires_grad=False)
    obj = {"encoder": tied, "decoder": tied, "frozen": frozen, "grad": weights((256, 256), 2).requires_grad_()}
    loaded = blpickle.loads(blpickle.dumps(obj))
    assert loaded["encoder"] is loaded["decoder"]
    assert type(loaded["encoder"]) is torch.nn.Parameter and loaded["encoder"].requires_grad
    assert type(loaded["frozen"]) is torch.nn.Parameter and not loaded["frozen"].requires_grad
    assert type(loaded["grad"]) is torch.Tensor and loaded["grad"].requires_grad and loaded["grad"].is_leaf
    assert torch.equal(loaded["frozen"], frozen) and torch.equal(loaded["grad"], obj["grad"])
    with blpickle.open(blpickle.dumps(obj)) as rec:
        assert set(rec.names) == {"encoder", "frozen", "grad"}  # decoder: the same parameter


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("bf16", [False, True])
def test_state_dicts_load_safely_with_no_allowlist(bf16):
    model, optimizer = model_and_optimizer()
    if bf16:
        model = model.to(torch.bfloat16)
    obj = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    loaded = blpickle.loads(blpickle.dumps(obj), safe=True)
    assert type(loaded["model"]) is OrderedDict and list(loaded["model"]) == list(obj["model"])
    assert all(same_bytes(obj["model"][k], loaded["model"][k]) for k in obj["model"])
    state = loaded["optimizer"]["state"]
    assert state.keys() == obj["optimizer"]["state"].keys()
    for number, moments in obj["optimizer"]["state"].items():
        assert all(same_bytes(moments[k], state[number][k]) for k in moments)
    assert loaded["optimizer"]["param_groups"] == obj["optimizer"]["param_groups"]
    fresh, _ = model_and_optimizer()
    fresh.load_state_dict({k: v.float() for k, v in loaded["model"].items()})


def test_open_gives_a_tensor_by_its_state_dict_key_reading_only_its_frames():
    model, _ = model_and_optimizer()
    state = {"model": model.state_dict(), "extra": {"layers.0.weight": weights((300, 300))}}
    file = Counting(blpickle.dumps(state))
    with blpickle.open(file) as rec:
        assert set(rec.names) == {"model.0.weight", "model.2.weight", "extra.layers.0.weight"}
        info = rec.arrays[rec.names.index("model.0.weight")]
        streams = rec.header.streams[: info.position + 2]
        # each chunk up to the tensor's last: its size field (and a compressed one's Blosc2 sizes)
        heads = sum(s.nchunks * (8 + (0 if s.raw else 16)) for s in streams)
        before = file.bytes_read()
        tensor = rec["model.0.weight"]
        assert file.bytes_read() - before == info.stored + 16 * info.nchunks + heads
        assert type(tensor) is torch.Tensor and torch.equal(tensor, state["model"]["0.weight"])
        assert torch.equal(rec["extra.layers.0.weight"], state["extra"]["layers.0.weight"])
        with pytest.raises(KeyError) as raised:
            rec["model.0.bias"]
        message = raised.value.args[0]
        assert "'model.0.weight'" in message and "arrays under 64 KiB are kept in the pickle" in message


def test_a_lazy_tensor_gives_tensors_of_its_dtype_and_numpy_its_stored_bytes():
    weight = weights((400, 300)).to(torch.bfloat16)
    with blpickle.open(blpickle.dumps({"weight": weight})) as rec:
        lazy = rec.lazy("weight")
        assert lazy.tensor == "torch.bfloat16" and lazy.dtype == np.uint16 and lazy.shape == (400, 300)
        rows = lazy[10:20, 5]
        assert type(rows) is torch.Tensor and rows.dtype == torch.bfloat16
        assert torch.equal(rows, weight[10:20, 5]) and torch.equal(lazy[-1], weight[-1])
        assert all(torch.equal(row, weight[i]) for i, row in enumerate(lazy))
        stored = np.asarray(lazy)
        assert type(stored) is np.ndarray and stored.dtype == np.uint16
        assert torch.equal(torch.from_numpy(stored).view(torch.bfloat16), weight)


# torch's own sparse rebuilder warns so in some versions (2.11), with pickle as with blpickle
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled:UserWarning")
def test_tensors_torch_keeps_its_own_reduction_for_still_round_trip():
    dense = weights((64, 64))
    dense.note = "an attribute"
    obj = {
        "sparse": dense.to_sparse(),
        "conj": torch.randn(300, 300, dtype=torch.complex64).conj(),
        "attribute": dense,
    }
    loaded = blpickle.loads(blpickle.dumps(obj))
    assert torch.equal(loaded["sparse"].to_dense(), dense)
    assert loaded["conj"].is_conj() and torch.equal(loaded["conj"], obj["conj"])
    assert loaded["attribute"].note == "an attribute"


def test_map_location_puts_tensors_on_a_device_and_outside_it_they_stay_on_the_cpu():
    obj = {"a": weights((300, 300)), "view": None}
    obj["view"] = obj["a"][5:]
    data = blpickle.dumps(obj)
    with map_location(torch.device("meta")):
        meta = blpickle.loads(data)
        with blpickle.open(data) as rec:
            assert rec["a"].device.type == "meta"
    assert meta["a"].device.type == "meta" and meta["view"].shape == (295, 300)
    assert blpickle.loads(data)["a"].device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tensors_load_on_the_cpu_unless_a_device_is_asked_for():
    base = weights((512, 512)).cuda()
    obj = {"base": base, "view": base[100:], "parameter": torch.nn.Parameter(weights((256, 256), 1).cuda())}
    data = blpickle.dumps(obj)
    cpu = blpickle.loads(data)
    assert all(cpu[key].device.type == "cpu" and torch.equal(cpu[key], obj[key].cpu()) for key in obj)
    assert shares(cpu["base"], cpu["view"])
    with map_location("cuda"):
        gpu = blpickle.loads(data)
    assert all(gpu[key].is_cuda and torch.equal(gpu[key], obj[key]) for key in obj)
    assert shares(gpu["base"], gpu["view"]) and type(gpu["parameter"]) is torch.nn.Parameter


# -- hostile arguments: what a forged record can make the pickle call ---------------------------


def storage(nbytes: int = 64) -> torch.UntypedStorage:
    return rebuild_storage(np.zeros(nbytes // 4, np.float32))


@pytest.mark.parametrize(
    "data",
    [
        b"\0" * 16,
        np.zeros(4, dtype=object),
        np.zeros((4, 4), np.float32)[:, ::2],  # not contiguous
        np.zeros(4, np.dtype(">f4")),  # byte-swapped
        np.zeros(4, np.dtype([("a", "<f4")])),
        np.zeros(4, "U4"),
    ],
)
def test_rebuild_storage_refuses_anything_but_a_contiguous_array_of_a_known_dtype(data):
    with pytest.raises(CorruptError, match="torch storage"):
        rebuild_storage(data)


def test_rebuild_storage_copies_read_only_memory():
    data = np.arange(16, dtype=np.float32)
    data.flags.writeable = False
    rebuilt = rebuild_storage(data)
    assert rebuilt.nbytes() == 64 and rebuilt.data_ptr() != data.ctypes.data


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ((b"\0" * 64, "float32", 0, (16,), (1,), False), "over a bytes"),
        ((np.zeros(16, np.float32), "float32", 0, (16,), (1,), False), "over a ndarray"),
        (("storage", "float128", 0, (4,), (1,), False), "dtype 'float128'"),
        (("storage", "Tensor", 0, (4,), (1,), False), "dtype 'Tensor'"),
        (("storage", torch.float32, 0, (4,), (1,), False), "dtype torch.float32"),
        (("storage", "float32", -1, (4,), (1,), False), "offset -1"),
        (("storage", "float32", 0, (4, 4), (1,), False), "strides"),
        (("storage", "float32", 0, (4,), (-1,), False), "strides"),
        (("storage", "float32", 0, (True,), (1,), False), "shape"),
        (("storage", "float32", 0, [4], [1], False), "shape"),
        (("storage", "float32", 0, (4,), (1,), 1), "requires_grad 1"),
        (("storage", "int32", 0, (4,), (1,), True), "requires_grad True"),
        (("storage", "float32", 0, (17,), (1,), False), "spans bytes 0:68 of a storage of 64 bytes"),
        (("storage", "float32", 13, (4,), (1,), False), "spans bytes 52:68"),
        (("storage", "float32", 0, (4, 4), (5, 1), False), "spans bytes 0:76"),
        (("storage", "float64", 0, (9,), (1,), False), "spans bytes 0:72"),
        (("storage", "float32", 0, (1 << 62, 2), (0, 0), False), "torch refuses"),
    ],
)
def test_rebuild_tensor_refuses_bad_arguments(args, why):
    args = tuple(storage() if isinstance(arg, str) and arg == "storage" else arg for arg in args)
    with pytest.raises(CorruptError, match=why.replace("(", r"\(")):
        rebuild_tensor(*args)


def test_rebuild_parameter_refuses_what_is_not_a_tensor_and_a_bool():
    tensor = rebuild_tensor(storage(), "float32", 0, (4,), (1,), False)
    for args in [(np.zeros(4), True), (tensor, 1), (torch.nn.Parameter(tensor), True), (tensor.int(), True)]:
        with pytest.raises(CorruptError, match="a parameter is a tensor and a bool"):
            rebuild_parameter(*args)


class _Call:
    """Pickles as ``func(*args)``: what a forged record's pickle can do."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.func, self.args


def test_a_forged_record_meets_the_same_checks_in_safe_mode():
    forged = _Call(rebuild_tensor, _Call(rebuild_storage, np.zeros(16, np.float32)), "float32", 0, (8,), (9,), False)
    for data in (pickle.dumps(forged, protocol=5), blpickle.dumps([forged])):
        with pytest.raises(CorruptError, match="spans bytes 0:256 of a storage of 64 bytes"):
            blpickle.loads(data, safe=True)
    storage = _Call(rebuild_storage, np.arange(16, dtype=np.float32))
    fine = _Call(rebuild_tensor, storage, "float32", 2, (2,), (3,), False)
    assert blpickle.loads(pickle.dumps(fine, protocol=5), safe=True).tolist() == [2.0, 5.0]


def test_safe_mode_still_refuses_torch_own_reconstructors():
    sparse = torch.from_numpy(np.zeros(3)).to_sparse()  # torch's own reduction: _rebuild_sparse_tensor
    with pytest.raises(blpickle.UnsafeLoadError, match="torch"):
        blpickle.loads(blpickle.dumps(sparse), safe=True)
