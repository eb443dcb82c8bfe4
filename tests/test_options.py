"""Options: validation, JSON round trip, presets."""

import json

import blosc2
import numpy as np
import pytest

import blpickle
from blpickle.engine.chunks import compress_chunk
from blpickle.engine.policy import blosc2_cparams
from blpickle.options import PRESETS, Options, resolve_options


def test_defaults_round_trip_through_json():
    for options in [Options(), *PRESETS.values(), Options(codec="zlib", clevel=9, shuffle="bitshuffle", nthreads=3)]:
        assert Options.from_dict(json.loads(json.dumps(options.to_dict()))) == options


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("codec", "gzip"),
        ("codec", 1),
        ("clevel", -1),
        ("clevel", 10),
        ("clevel", True),
        ("clevel", 1.0),
        ("shuffle", "yes"),
        ("bytedelta", 1),
        ("chunk_size", 1024),
        ("chunk_size", 2**31),
        ("nthreads", 0),
        ("nthreads", 1000),
        ("pickler", "dill"),
    ],
)
def test_invalid_values_raise_options_error_naming_the_field(field, value):
    with pytest.raises(blpickle.OptionsError, match=field):
        Options(**{field: value})
    assert issubclass(blpickle.OptionsError, ValueError)


def test_unknown_fields_and_presets_are_refused():
    with pytest.raises(blpickle.OptionsError, match="colour"):
        Options.from_dict({"colour": "red"})
    with pytest.raises(blpickle.OptionsError, match="colour"):
        Options().replace(colour="red")
    with pytest.raises(blpickle.OptionsError, match="preset"):
        resolve_options("turbo")


def test_presets_and_overrides():
    assert resolve_options() == PRESETS["default"]
    assert resolve_options("fast").codec == "lz4"
    assert resolve_options("raw").codec is None
    assert resolve_options("small", clevel=9) == PRESETS["small"].replace(clevel=9)
    assert resolve_options(Options(codec="zlib"), clevel=3) == Options(codec="zlib", clevel=3)


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        Options().clevel = 3  # type: ignore[misc]


def test_blosc2_parameters_follow_the_options():
    params = blosc2_cparams(Options(codec="lz4", clevel=7, shuffle="bitshuffle", bytedelta=True), 4)
    assert params["codec"] == blosc2.Codec.LZ4
    assert params["clevel"] == 7
    assert params["typesize"] == 4
    assert params["nthreads"] == 1
    assert params["filters"] == [blosc2.Filter.BITSHUFFLE, blosc2.Filter.BYTEDELTA]


def test_bytes_are_not_byte_shuffled():
    """Shuffling 1-byte elements is the identity, which Blosc2 runs 2-4x slower than no filter."""
    assert blosc2_cparams(Options(), 1, "lz4")["filters"] == [blosc2.Filter.NOFILTER]
    delta = blosc2_cparams(Options(bytedelta=True), 1, "lz4")
    assert delta["filters"] == [blosc2.Filter.NOFILTER, blosc2.Filter.BYTEDELTA]
    assert blosc2_cparams(Options(shuffle="bitshuffle"), 1, "lz4")["filters"] == [blosc2.Filter.BITSHUFFLE]
    assert blosc2_cparams(Options(), 2, "lz4")["filters"] == [blosc2.Filter.SHUFFLE]


def test_threads_default_to_the_available_cpus():
    assert Options().threads >= 1
    assert Options(nthreads=3).threads == 3


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_round_trips_data(preset):
    import numpy as np

    array = np.arange(100_000, dtype="f4")
    assert np.array_equal(blpickle.loads(blpickle.dumps(array, preset=preset)), array)


@pytest.mark.parametrize("typesize", [1, 2, 3, 4, 8, 12, 16, 255])
def test_zstd_blocks_round_trip_for_every_element_and_data_size(typesize):
    """Blosc2 writes wrong chunks for an explicit block size that is larger than the data or
    not a multiple of the element size: compress_chunk must never ask for one."""
    rng = np.random.default_rng(typesize)
    options = Options(codec="zstd")
    for nbytes in (1, 3099, 300_001, (1 << 20) - 1, (1 << 20) + 3, (3 << 20) + 7):
        data = (np.cumsum(rng.integers(-2, 3, nbytes)) % 256).astype(np.uint8).tobytes()
        for cparams in (blosc2_cparams(options, typesize), blosc2_cparams(options.replace(bytedelta=True), typesize)):
            assert blosc2.decompress2(compress_chunk(data, cparams)) == data, (nbytes, cparams["filters"])


def test_the_dense_preset_compresses_as_blosc2_save_tensor_defaults():
    """The preset that matches ``blosc2.save_tensor``'s defaults (zstd, level 5, byte
    shuffle: the blosc2 the floor of pyproject allows had level 1) stores buffers so."""
    dense = PRESETS["dense"]
    assert (dense.codec, dense.clevel, dense.shuffle, dense.bytedelta) == ("zstd", 5, "shuffle", False)
    array = np.arange(300_000, dtype=np.int64)
    (buffer,) = blpickle.inspect(blpickle.dumps(array, preset="dense")).buffers
    assert buffer.codec == "zstd"
