"""The goals of ``/work/shared/design.md``, checked against the figures of one run."""

from __future__ import annotations

import dataclasses
import operator

from blpickle import PRESETS

from .contenders import DEFAULT, preset_name
from .datasets import SIZES

#: The contenders the goals compare blpickle's presets with (``--quick`` runs only these).
REFERENCES = (
    *(preset_name(name) for name in PRESETS),
    "pickle p5",
    "np.save",
    "joblib zlib-3",
    "joblib lz4",
    "joblib lz4-3 (HC)",
    "blosc2 save_tensor",
)
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le}
#: Speeds compared for the goals: best runs, loads with a hot page cache, as design.md's table.
_SPEEDS = ("dump", "load_hot")


@dataclasses.dataclass(frozen=True)
class Goal:
    """One goal: the measured values (label -> value) must all satisfy ``op threshold``."""

    text: str
    op: str
    threshold: float
    measured: dict[str, float]
    unit: str = "x"

    @property
    def worst(self) -> float | None:
        if not self.measured:
            return None
        pick = max if self.op == "<=" else min
        return pick(self.measured.values())

    @property
    def status(self) -> str:
        if self.worst is None:
            return "N/A"
        return "PASS" if _OPS[self.op](self.worst, self.threshold) else "FAIL"

    @property
    def summary(self) -> str:
        """The goal, the worst measured value, the threshold and every value."""
        if self.worst is None:
            return f"{self.text}: not measured in this run"
        values = ", ".join(f"{label} {value:.3g}{self.unit}" for label, value in self.measured.items())
        need = f"need {self.op} {self.threshold:.3g}{self.unit}"
        return f"{self.text}: worst {self.worst:.3g}{self.unit} ({need}; {values})"

    def to_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "worst": self.worst,
            "status": self.status,
            "summary": self.summary,
        }


def speed(row: dict, what: str) -> float:
    """MB/s of a row's best ``dump``, ``load_hot`` or ``load_cold`` run; ``ratio`` as is."""
    if what == "ratio":
        return row["ratio"]
    return row["nbytes"] / 1e6 / row[what]["min"]


def relative(rows: list[dict], method: str, what: str, datasets: tuple[str, ...] | None = None) -> dict[str, float]:
    """blpickle default's ``what`` over ``method``'s, per (dataset, size) where both ran."""
    found = {(r["dataset"], r["size"], r["method"]): r for r in rows}
    out = {}
    for (dataset, size, name), row in found.items():
        other = found.get((dataset, size, method))
        if name == DEFAULT and other and (datasets is None or dataset in datasets):
            out[f"{dataset}/{size}"] = speed(row, what) / speed(other, what)
    return out


def _growth(rows: list[dict], what: str) -> dict[str, float]:
    """blpickle default's speed at the largest array size over its speed at the mid size."""
    ours = {(r["dataset"], r["size"]): r for r in rows if r["method"] == DEFAULT and r["size"] in SIZES}
    largest = max((size for _, size in ours), key=SIZES.__getitem__, default="mid")
    return {
        f"{dataset} {largest}/mid": speed(ours[dataset, largest], what) / speed(row, what)
        for (dataset, size), row in ours.items()
        if size == "mid" and largest != "mid"
    }


def check(rows: list[dict], memory: list[dict]) -> list[Goal]:
    """Evaluate every goal on the array rows of mid size and up, the graph rows and memory."""
    arrays = [r for r in rows if r["size"] not in ("small", "graph")]
    graphs = [r for r in rows if r["size"] == "graph"]
    goals = []
    for what in _SPEEDS:
        name = "dump" if what == "dump" else "load (hot)"
        goals += [
            Goal(f"{name} >= 3x joblib lz4", ">=", 3, relative(arrays, "joblib lz4", what)),
            Goal(
                f"{name} >= blosc2 save/load_tensor",
                ">=",
                1,
                relative(arrays, "blosc2 save_tensor", what),
            ),
        ]
    goals += [
        Goal("dump >= 20x joblib zlib-3", ">=", 20, relative(arrays, "joblib zlib-3", "dump")),
        Goal(
            "dump >= 10x joblib lz4-3 (HC)",
            ">=",
            10,
            relative(arrays, "joblib lz4-3 (HC)", "dump"),
        ),
        Goal("ratio better than joblib lz4", ">", 1, relative(arrays, "joblib lz4", "ratio")),
        Goal("ratio >= blosc2 save_tensor", ">=", 1, relative(arrays, "blosc2 save_tensor", "ratio")),
        Goal("load (hot) faster than pickle p5", ">", 1, relative(arrays, "pickle p5", "load_hot")),
        Goal(
            "low entropy: dump faster than np.save",
            ">",
            1,
            relative(arrays, "np.save", "dump", ("low",)),
        ),
    ]
    for op in ("dump", "load"):
        extra = {f"{m['dataset']}/{m['size']}": m[op] for m in memory if m["method"] == DEFAULT}
        goals.append(Goal(f"extra peak memory on {op} <= 64 MiB", "<=", 64, extra, " MiB"))
    for what in _SPEEDS:
        name = "dump" if what == "dump" else "load"
        goals += [
            Goal(
                f"object-heavy graph: {name} within 10% of pickle",
                ">=",
                1 / 1.1,
                relative([r for r in graphs if r["dataset"] == "objects"], "pickle p5", what),
            ),
            Goal(
                f"many small arrays (forest): {name} within 30% of pickle",
                ">=",
                1 / 1.3,
                relative([r for r in graphs if r["dataset"] == "forest"], "pickle p5", what),
            ),
            Goal(
                f"{name} speed does not fall with size (>= 0.9 of mid)",
                ">=",
                0.9,
                _growth(rows, what),
            ),
        ]
    return goals + check_pareto(arrays)


#: The axes of the Pareto goals and how close a preset must come to a peer on each
#: (the preset's figure over the peer's).
PARETO_MARGINS = {"ratio": 0.99, "dump": 1.0, "load_hot": 0.95}


def pareto(rows: list[dict]) -> list[dict]:
    """For each peer (a contender that is not blpickle) on each array dataset and size: how
    far it beats blpickle's default on all three axes at once (``dominance``: the least of its
    ratio, dump and hot-load speed over the default's; above 1 it is better on all three),
    and the preset that comes closest to covering it (``margin``: the least of the preset's
    figures over the peer's, each divided by its `PARETO_MARGINS`; at least 1 covers it)."""
    found = {(r["dataset"], r["size"], r["method"]): r for r in rows if r["size"] not in ("small", "graph")}
    presets = {preset_name(name): name for name in PRESETS}
    out = []
    for (dataset, size, method), peer in found.items():
        default = found.get((dataset, size, DEFAULT))
        if method.startswith("blpickle") or default is None:
            continue
        entry: dict = {"dataset": dataset, "size": size, "peer": method, "preset": None, "margin": None}
        entry["dominance"] = min(speed(peer, what) / speed(default, what) for what in PARETO_MARGINS)
        for contender, name in presets.items():
            ours = found.get((dataset, size, contender))
            if ours is None:
                continue
            relative = {what: speed(ours, what) / speed(peer, what) for what in PARETO_MARGINS}
            margin = min(relative[what] / least for what, least in PARETO_MARGINS.items())
            if entry["margin"] is None or margin > entry["margin"]:
                entry.update(preset=name, margin=margin, relative=relative)
        out.append(entry)
    return out


def check_pareto(rows: list[dict]) -> list[Goal]:
    """Issue 17's big-buffer goals: (a) no peer better than the default on dump, load and
    ratio at once, on any dataset and size; (b) for each peer, on each, a preset with ratio
    >= 0.99x, dump >= 1.0x and load >= 0.95x of the peer's."""
    entries = pareto(rows)
    worst: dict[str, dict] = {}
    for entry in entries:
        where = f"{entry['dataset']}/{entry['size']}"
        if where not in worst or entry["dominance"] > worst[where]["dominance"]:
            worst[where] = entry
    goals = [
        Goal(
            "Pareto (a): no peer better than the default on dump, load and ratio at once (least of the three)",
            "<=",
            1,
            {f"{where} {entry['peer']}": entry["dominance"] for where, entry in worst.items()},
        )
    ]
    for peer in dict.fromkeys(entry["peer"] for entry in entries):
        covered = {
            f"{e['dataset']}/{e['size']} {e['preset']}": e["margin"]
            for e in entries
            if e["peer"] == peer and e["margin"] is not None
        }
        goals.append(Goal(f"Pareto (b): a preset as good as {peer} on all three (margin)", ">=", 1, covered))
    return goals


def pareto_table(rows: list[dict]) -> list[tuple[str, ...]]:
    """The Pareto entries as table lines: each peer, how it compares with the default, and
    the best preset's figures over the peer's."""
    lines: list[tuple[str, ...]] = [
        ("dataset", "peer", "peer/default (least)", "best preset", "ratio", "dump", "load (hot)", "covers")
    ]
    for e in pareto(rows):
        relative = e.get("relative", {})
        lines.append(
            (
                f"{e['dataset']}/{e['size']}",
                e["peer"],
                f"{e['dominance']:.2f}x",
                e["preset"] or "-",
                *(f"{relative[what]:.2f}x" if what in relative else "-" for what in PARETO_MARGINS),
                "-" if e["margin"] is None else "yes" if e["margin"] >= 1 else "no",
            )
        )
    return lines


#: Issue 17's goals for small objects: workload -> (op, least speed relative to pickle's).
FIXED_COST_SPEEDS = {
    ("tiny dict {'a': 1}", "round trip"): 1 / 4,
    ("list of 1,000 ints", "round trip"): 0.8,
    ("list of 100 small dicts", "round trip"): 0.8,
    ("200 arrays of 800 bytes", "round trip"): 0.7,
    ("forest (100 trees) via a path", "dump"): 0.8,
    ("forest (100 trees) via a path", "load"): 0.8,
    # issue 29: a small object dumped to a path, over pickle's open + dump + close
    ("small dict in a directory of 10,000 files", "dump"): 0.5,
}
#: The most bytes a tiny record may have beyond pickle's.
FIXED_COST_EXTRA_BYTES = 40


def check_fixed(rows: list[dict]) -> list[Goal]:
    """The fixed-cost goals on the rows of `bench.fixed_cost` (best samples)."""
    found = {(r["workload"], r["op"]): r for r in rows}
    goals = [
        Goal(
            f"{workload}: {op} >= {least:.2g}x pickle's speed",
            ">=",
            least,
            {op: found[workload, op]["speed_best"]} if (workload, op) in found else {},
        )
        for (workload, op), least in FIXED_COST_SPEEDS.items()
    ]
    size = found.get(("tiny dict {'a': 1}", "size"))
    goals.append(
        Goal(
            f"tiny dict: at most {FIXED_COST_EXTRA_BYTES} bytes over pickle's",
            "<=",
            FIXED_COST_EXTRA_BYTES,
            {"extra": size["extra_bytes"]} if size else {},
            " B",
        )
    )
    return goals


#: Issue 17's goals for small tasks: (workload, what) -> least speed relative to the default's.
SMALL_TASK_SPEEDS = {
    ("Pool.map (chunksize 1)", "small tasks"): 0.9,
    ("ProcessPoolExecutor.map", "small tasks"): 0.9,
    ("joblib.Parallel (loky)", "small tasks"): 0.9,
    ("joblib.Memory", "hit, small results"): 0.9,
    ("joblib.Memory", "miss, small results"): 0.9,
    ("dask graph (+1 combining task)", "small results"): 0.9,
}
#: Big buffers between processes: least speed relative to the standard library's.
BIG_TRANSFER_SPEEDS = {"compressible": 1.5, "random": 1 / 1.1}


def check_processes(section: dict[str, list[dict]]) -> list[Goal]:
    """The goals on the rows of `bench.small_tasks` (best samples): small tasks at least
    0.9x the defaults' throughput, a big cached result still faster than joblib's store,
    and big transfers keeping their gain (`bench.processes_bench`'s rows)."""
    found = {(r["workload"], r["op"]): r for r in section["small"]}
    goals = [
        Goal(
            f"{workload}, {what}: >= {least:.2g}x the default's speed",
            ">=",
            least,
            {found[workload, what]["reference_name"]: found[workload, what]["speed_best"]}
            if (workload, what) in found
            else {},
        )
        for (workload, what), least in SMALL_TASK_SPEEDS.items()
    ]
    big_hits = {
        f"{r['op']}": r["speed_best"] for r in section["small"] if r["op"].startswith("hit, ") and r["count"] == 1
    }
    goals.append(Goal("joblib.Memory, big result: hit faster than joblib's store", ">", 1, big_hits))
    for data, least in BIG_TRANSFER_SPEEDS.items():
        measured = {
            f"{r['transport']} {r['nbytes'] // 10**6} MB {op.replace('_', ' ')}": r[f"speedup_{op}"]
            for r in section["big"]
            if r["data"] == data
            for op in ("send", "round_trip")
        }
        goals.append(
            Goal(f"big {data} buffers to a process: >= {least:.2g}x the stdlib's speed", ">=", least, measured)
        )
    return goals


#: blpickle's load throughput over Blosc2's own on the same buffer with the same parameters.
PIPELINE_LOAD_EFFICIENCY = 0.95


def check_pipeline(rows: list[dict]) -> list[Goal]:
    """The load pipeline's efficiency (best samples) on the rows of `bench.pipeline`; the
    dump's is reported there without a goal."""
    loads = {f"{r['workload']}": r["speed_best"] for r in rows if r["op"] == "load"}
    return [
        Goal(
            f"load pipeline >= {PIPELINE_LOAD_EFFICIENCY:.2g}x Blosc2's own throughput, same parameters",
            ">=",
            PIPELINE_LOAD_EFFICIENCY,
            loads,
        )
    ]


#: Issue 30's goals: files smaller than pickle's by these factors, by workload of `bench.tensors`, ...
TENSOR_RATIOS = {
    "state dict fp32": 1.15,
    "state dict bf16": 1.40,
    "jax float32 + bfloat16": 1.2,
    "ml_dtypes bfloat16": 1.4,
}
#: ... dump and load at these speeds of torch.save's and torch.load's on the fp32 state dict, ...
TENSOR_SPEEDS = {"dump": 0.9, "load": 0.8}
#: ... a storage stored once with its view and alias, and one weight read this much faster than a load.
TENSOR_SHARED_FILE = 1.05
TENSOR_OPEN_SPEEDUP = 5.0


def check_tensors(doc: dict) -> list[Goal]:
    """Issue 30's goals on the rows of `bench.tensors`."""
    rows = {row["workload"]: row for row in doc["rows"]}
    fp32 = rows["state dict fp32"]
    found = [
        Goal(f"tensors: file smaller than pickle's, {name}", ">=", ratio, {name: rows[name]["vs_pickle"]})
        for name, ratio in TENSOR_RATIOS.items()
    ]
    found += [
        Goal(f"tensors: {op} speed over torch's, fp32 state dict", ">=", speed, {"best": fp32[f"{op}_speed"]})
        for op, speed in TENSOR_SPEEDS.items()
    ]
    shared = rows["tensor + view + alias"]["file_over_storage"]
    found.append(
        Goal(
            "tensors: a storage with its view and alias, file over storage", "<=", TENSOR_SHARED_FILE, {"file": shared}
        )
    )
    found.append(
        Goal("tensors: open(path)[name] over a full load", ">=", TENSOR_OPEN_SPEEDUP, {"best": fp32["open"]["speedup"]})
    )
    return found


#: The names of blpickle's default and pickle's rows in `bench.real_objects`.
REAL_OURS, REAL_REFERENCE, REAL_PATH_REFERENCE = "blpickle", "pickle p5", "pickle p5 via a path"


def real_relative(rows: list[dict], case: str, method: str, what: str, reference: str = REAL_REFERENCE) -> float | None:
    """``reference``'s best time over ``method``'s for ``what`` (dump, load, cold) in
    ``case``; for ``size``, the reference's file size over the method's. None if either is
    missing or was not measured."""
    found = {r["method"]: r for r in rows if r["case"] == case}
    ours, theirs = found.get(method), found.get(reference)
    if ours is None or theirs is None or (what != "size" and not (what in ours and what in theirs)):
        return None
    if what == "size":
        return theirs["file_bytes"] / ours["file_bytes"]
    return theirs[what]["min"] / ours[what]["min"]


#: Issue 29's goals on real objects: case -> least (dump, load) speed relative to pickle's
#: (to an open file, whichever way blpickle goes).
REAL_SPEEDS = {
    "noisy float64, 80 KB": (0.5, 0.5),
    "noisy float64, 800 KB": (0.7, 0.8),
    "noisy float64, 8 MB": (0.8, 1.0),
    "dict of 50 mixed arrays of 2 MB": (0.8, 1.0),
    "DataFrame, 1M rows": (0.8, 1.0),
    "CSR matrix, 5M nonzeros": (0.8, 1.0),
    "xarray Dataset, 3 x 20 MB": (0.8, 1.0),
    "forest (100 trees) via a path": (0.8, 0.8),
    "200k-entry dict": (0.9, 0.9),
}
#: Objects made of numpy buffers, whose file must be smaller than pickle's.
REAL_SMALLER = (
    "dict of 50 mixed arrays of 2 MB",
    "DataFrame, 1M rows",
    "CSR matrix, 5M nonzeros",
    "xarray Dataset, 3 x 20 MB",
)
#: blpickle's throughput on many arrays over its throughput on one array of the same bytes.
REAL_MANY_ARRAYS = ("500 arrays of 200 KB", "1 array of 100 MB", 0.85)
#: A small object dumped to a path, over pickle's open + dump + close.
REAL_SMALL_PATH = ("small dict of arrays via a path", 0.5)


def check_real(rows: list[dict]) -> list[Goal]:
    """Issue 29's goals on the rows of `bench.real_objects` (best samples)."""

    def measured(case: str, what: str, reference: str | None = None) -> dict[str, float]:
        value = real_relative(rows, case, REAL_OURS, what, *((reference,) if reference else ()))
        return {} if value is None else {what: value}

    goals = []
    for case, speeds in REAL_SPEEDS.items():
        for what, least in zip(("dump", "load"), speeds, strict=True):
            goals.append(
                Goal(f"real: {case}, {what} >= {least:.2g}x pickle's speed", ">=", least, measured(case, what))
            )
    for case in REAL_SMALLER:
        goals.append(Goal(f"real: {case}, file smaller than pickle's", ">", 1, measured(case, "size")))
    many, one, least = REAL_MANY_ARRAYS
    for what in ("dump", "load"):
        found = {r["case"]: r for r in rows if r["method"] == REAL_OURS}
        value = {what: found[one][what]["min"] / found[many][what]["min"]} if many in found and one in found else {}
        goals.append(Goal(f"real: {many}, {what} >= {least:.2g}x the throughput of {one}", ">=", least, value))
    case, least = REAL_SMALL_PATH
    goals.append(
        Goal(
            f"real: {case}, dump >= {least:.2g}x pickle's open + dump + close",
            ">=",
            least,
            measured(case, "dump", REAL_PATH_REFERENCE),
        )
    )
    return goals
