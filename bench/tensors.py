"""Tensors: torch state dicts, an optimizer state, jax arrays and ml_dtypes arrays through
blpickle's default, against pickle's file size and ``torch.save``/``torch.load``'s speed.

Workloads: the seeded 6-layer transformer encoder of issue 30 (d_model 512, 8 heads, ~19M
parameters) as an fp32 and a bf16 state dict, its Adam optimizer state dict after one step, its
weights as jax float32 and bfloat16 arrays and as numpy arrays of ``ml_dtypes.bfloat16``, and a
16 MB tensor stored with a view and a reshaped alias of its storage. Dumps write to the page
cache (neither side fsyncs) and loads read it; interleaved rounds, best (median). ``open`` reads one weight
by its state dict key (``blpickle.open(path)[name]``) against loading the whole record.

Run on its own: ``python -m bench --section tensors [--quick]`` (needs torch, jax and
ml_dtypes: ``pip install -e ".[bench,tensors]"``).
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from typing import Any

import numpy as np

import blpickle

from .report import text_table
from .timing import interleaved

ROUNDS, QUICK_ROUNDS = 7, 3
#: The weight read alone from the fp32 state dict's record.
NAME = "layers.0.linear1.weight"


def transformer(layers: int = 6) -> Any:
    """The seeded encoder of issue 30 (its initial weights), of ``layers`` layers (12.6 MB of
    fp32 weights each)."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)


def workloads() -> dict[str, Any]:
    """Every workload, by name."""
    import jax.numpy as jnp
    import ml_dtypes
    import torch

    model = transformer()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16, 512, generator=torch.Generator().manual_seed(1))).sum().backward()
    optimizer.step()
    state = model.state_dict()
    weights = {k: v.numpy() for k, v in state.items()}
    base = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(2))
    return {
        "state dict fp32": state,
        "state dict bf16": {k: v.to(torch.bfloat16) for k, v in state.items()},
        "Adam state dict": optimizer.state_dict(),
        "jax float32 + bfloat16": {
            **{f"f32.{k}": jnp.asarray(v) for k, v in weights.items()},
            **{f"bf16.{k}": jnp.asarray(v, dtype=jnp.bfloat16) for k, v in weights.items()},
        },
        "ml_dtypes bfloat16": {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()},
        "tensor + view + alias": {"base": base, "view": base[100:200, ::2], "alias": base.reshape(-1)},
    }


def measure(name: str, obj: Any, directory: str, rounds: int) -> dict[str, Any]:
    """Sizes for every workload; for torch's, dump and load times against torch's own."""
    import torch

    ours, theirs = os.path.join(directory, "x.blp"), os.path.join(directory, "x.pt")
    blpickle.dump(obj, ours)
    row: dict[str, Any] = {
        "workload": name,
        "nbytes": _nbytes(obj),
        "pickle_bytes": len(pickle.dumps(obj, protocol=5)),
        "blpickle_bytes": os.path.getsize(ours),
    }
    row["vs_pickle"] = row["pickle_bytes"] / row["blpickle_bytes"]
    loaded = blpickle.load(ours)
    if not _same(obj, loaded):
        raise AssertionError(f"blpickle did not load back the {name} it dumped")
    if name.startswith(("state dict", "Adam")):
        torch.save(obj, theirs)
        row["torch_bytes"] = os.path.getsize(theirs)
        dumps = interleaved(
            {
                "blpickle": lambda: blpickle.dump(obj, ours),
                "torch.save": lambda: torch.save(obj, theirs),
            },
            rounds,
            0.0,
        )
        loads = interleaved(
            {"blpickle": lambda: blpickle.load(ours), "torch.load": lambda: torch.load(theirs)}, rounds, 0.0
        )
        row["dump"], row["load"] = dumps, loads
        row["dump_speed"] = dumps["torch.save"]["min"] / dumps["blpickle"]["min"]
        row["load_speed"] = loads["torch.load"]["min"] / loads["blpickle"]["min"]
    if name == "state dict fp32":
        row["open"] = _open_one(ours, obj[NAME], rounds)
    if name == "tensor + view + alias":
        base = obj["base"]
        row["file_over_storage"] = row["blpickle_bytes"] / (base.numel() * base.element_size())
        ptrs = {loaded[key].untyped_storage().data_ptr() for key in obj}
        if len(ptrs) != 1:
            raise AssertionError("the tensor, its view and its alias do not share one storage after load")
    return row


def _open_one(path: str, expected: Any, rounds: int) -> dict[str, Any]:
    """``blpickle.open(path)[NAME]`` against ``blpickle.load(path)``."""
    import torch

    def read_one() -> Any:
        with blpickle.open(path) as rec:
            return rec[NAME]

    if not torch.equal(read_one(), expected):
        raise AssertionError(f"open(path)[{NAME!r}] differs from the tensor dumped")
    times = interleaved({"open": read_one, "load": lambda: blpickle.load(path)}, rounds, 0.0)
    return {**times, "speedup": times["load"]["min"] / times["open"]["min"]}


def parameters_survive() -> bool:
    """Whether a model's named parameters come back as parameters with ``requires_grad``."""
    import torch

    model = transformer()
    model.layers[0].norm1.weight.requires_grad_(False)
    parameters = dict(model.named_parameters())
    loaded = blpickle.loads(blpickle.dumps(parameters))
    return all(
        type(loaded[k]) is torch.nn.Parameter
        and loaded[k].requires_grad == p.requires_grad
        and torch.equal(loaded[k], p)
        for k, p in parameters.items()
    )


def _leaves(obj: Any) -> list[Any]:
    """The arrays and tensors of nested dicts and lists, in order."""
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in _leaves(value)]
    if isinstance(obj, (list, tuple)):
        return [leaf for value in obj for leaf in _leaves(value)]
    return [obj] if hasattr(obj, "dtype") else []


def _nbytes(obj: Any) -> int:
    return sum(leaf.nbytes for leaf in _leaves(obj))


def _same(expected: Any, actual: Any) -> bool:
    pairs = zip(_leaves(expected), _leaves(actual), strict=True)
    return all(type(a) is type(b) and a.dtype == b.dtype and _bytes(a) == _bytes(b) for a, b in pairs)


def _bytes(leaf: Any) -> bytes:
    if hasattr(leaf, "untyped_storage"):  # torch's bfloat16 has no numpy dtype
        import torch

        return leaf.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return np.asarray(leaf).tobytes()


def run(quick: bool) -> dict[str, Any]:
    """Every row of the section, printed as tables once measured."""
    rounds = QUICK_ROUNDS if quick else ROUNDS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="blpickle-tensors-") as directory:
        rows = [measure(name, obj, directory, rounds) for name, obj in workloads().items()]
    doc = {"rows": rows, "parameters_survive": parameters_survive(), "rounds": rounds}
    print(
        f"\nTensors: blpickle's default against pickle and torch.save/torch.load ({time.perf_counter() - started:.0f} s)"
    )
    print(text_table(table(rows)))
    opened = next(row["open"] for row in rows if "open" in row)
    print(
        f"open(path)[{NAME!r}]: {opened['open']['min'] * 1e3:.1f} ms, full load {opened['load']['min'] * 1e3:.1f} ms "
        f"({opened['speedup']:.1f}x); parameters come back as parameters: {doc['parameters_survive']}",
        flush=True,
    )
    return doc


def table(rows: list[dict]) -> list[tuple[str, ...]]:
    """Sizes, then speeds against torch's (best (median) ms, and torch's time over ours)."""

    def ms(spread: dict) -> str:
        return f"{spread['min'] * 1e3:.0f} ({spread['median'] * 1e3:.0f})"

    lines: list[tuple[str, ...]] = [
        (
            "workload",
            "MB",
            "pickle / blpickle",
            "torch.save / blpickle",
            "dump ms",
            "torch.save ms",
            "load ms",
            "torch.load ms",
            "dump speed",
            "load speed",
        )
    ]
    for row in rows:
        timed = "dump" in row
        lines.append(
            (
                row["workload"],
                f"{row['nbytes'] / 1e6:.1f}",
                f"{row['vs_pickle']:.3f}x",
                f"{row['torch_bytes'] / row['blpickle_bytes']:.3f}x" if "torch_bytes" in row else "-",
                ms(row["dump"]["blpickle"]) if timed else "-",
                ms(row["dump"]["torch.save"]) if timed else "-",
                ms(row["load"]["blpickle"]) if timed else "-",
                ms(row["load"]["torch.load"]) if timed else "-",
                f"{row['dump_speed']:.2f}x" if timed else "-",
                f"{row['load_speed']:.2f}x" if timed else "-",
            )
        )
    return lines
