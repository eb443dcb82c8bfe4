"""blpickle.integrations.multiprocessing: Pipe, Queue, SimpleQueue, Pool and
ProcessPoolExecutor send objects with blpickle under fork, spawn and forkserver."""

from __future__ import annotations

import concurrent.futures
import copyreg
import gc
import multiprocessing
import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest
from bombs import peak_allocated
from conftest import assert_same_array

import blpickle
from blpickle.integrations import _mp_connection as mp_connection
from blpickle.integrations import multiprocessing as bmp
from blpickle.integrations import transport

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Python >= 3.12: fork with threads

METHODS = ["fork", "spawn", "forkserver"]
MiB = 1 << 20
RNG = np.random.default_rng(5)


def sample_objects() -> dict[str, object]:
    """Arrays that take every path: in band, raw, compressed, strided, read-only, odd dtypes."""
    readonly = np.arange(300_000, dtype=np.int32)
    readonly.flags.writeable = False
    return {
        "compressible": np.arange(1_000_000, dtype=np.int64),  # 8 MB: compressed in chunks
        "random": RNG.random(300_000),  # 2.4 MB: raw
        "small": np.arange(10, dtype=np.float32),  # in band
        "fortran": np.asfortranarray(np.arange(600_000, dtype=np.float64).reshape(1000, 600)),
        "strided": np.arange(2_000_000, dtype=np.int16)[::3],
        "readonly": readonly,
        "datetime": np.arange(200_000).astype("M8[s]"),
        "structured": np.zeros(100_000, dtype=[("a", "i4"), ("b", "f8")]),
        "unicode": np.array(["abc", "de"] * 50_000),
        "bigendian": np.arange(200_000, dtype=">f8"),
        "zero_d": np.array(3.5),
        "empty": np.empty((0, 5)),
        "objects": np.array([1, "two", None], dtype=object),
        "bytes": b"x" * 100_000,
        "bytearray": bytearray(b"y" * 100_000),
        "text": "hello",
        "nested": [{"k": np.ones(50_000)}, (1, 2.5, None)],
    }


def check_objects(expected: dict, actual: dict) -> None:
    assert set(actual) == set(expected)
    for key, value in expected.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            assert_same_array(np.ascontiguousarray(value) if key == "strided" else value, actual[key])
        elif key == "nested":
            assert_same_array(value[0]["k"], actual[key][0]["k"])
            assert actual[key][1] == value[1]
        elif isinstance(value, np.ndarray):
            assert list(actual[key]) == list(value)
        else:
            assert actual[key] == value and type(actual[key]) is type(value)


def send_in_thread(conn: bmp.Connection, obj: object) -> threading.Thread:
    """Send from another thread: a pipe only holds 64 KiB, so one thread can't do both."""
    thread = threading.Thread(target=conn.send, args=(obj,))
    thread.start()
    return thread


# --- the connection, in one process ------------------------------------------------------------


@pytest.mark.parametrize("compress", ["auto", True, False])
@pytest.mark.parametrize("duplex", [False, True])
def test_pipe_round_trip_every_kind_of_buffer(compress, duplex):
    ctx = bmp.get_context("fork", compress=compress, nthreads=2)
    reader, writer = ctx.Pipe(duplex=duplex)
    objects = sample_objects()
    thread = send_in_thread(writer, objects)
    received = reader.recv()
    thread.join()
    check_objects(objects, received)


def test_auto_compresses_what_pays_and_sends_the_rest_raw():
    wire = transport.wire_options()
    _, buffers = transport.pickle_graph([np.arange(1_000_000), RNG.random(1_000_000), np.arange(100)], wire, ())
    assert len(buffers) == 2  # the small one stays in band
    transfers = transport.plan_buffers(buffers, wire)
    assert transfers[0].chunk_size > 0  # compressible: chunks
    assert transfers[1].chunk_size == 0  # random: raw
    assert transfers[0].chunk_size % 8 == 0


def test_an_object_without_big_buffers_is_one_plain_pickle_message():
    reader, writer = bmp.Pipe(duplex=False)
    obj = {"a": 1, "small": np.arange(10), "f": echo}
    writer.send(obj)
    data = reader.recv_bytes()  # a standard message: what multiprocessing itself would send
    loaded = pickle.loads(data)
    assert loaded["a"] == 1 and loaded["f"] is echo
    assert_same_array(obj["small"], loaded["small"])


class _Point:
    def __init__(self, x: int) -> None:
        self.x = x


def _point_as_tuple(point: _Point) -> tuple:
    return tuple, ((point.x,),)


def test_each_message_uses_copyregs_reducers_as_they_are_then():
    reader, writer = bmp.Pipe(duplex=False)
    writer.send(_Point(1))
    assert reader.recv().x == 1
    copyreg.pickle(_Point, _point_as_tuple)
    try:
        writer.send(_Point(2))
        assert reader.recv() == (2,)
    finally:
        del copyreg.dispatch_table[_Point]
    writer.send(_Point(3))
    assert reader.recv().x == 3


def test_an_object_with_big_buffers_has_a_head_and_its_buffers_follow():
    reader, writer = bmp.Pipe(duplex=False)
    noise = RNG.random(100_000)  # incompressible: it follows raw
    thread = send_in_thread(writer, {"big": noise})
    first = reader.recv_bytes()
    assert first.startswith(mp_connection.MAGIC)
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(first[mp_connection.HEAD.size + mp_connection.DESC.size :])  # the graph needs its buffer
    raw = bytearray()
    while len(raw) < noise.nbytes:
        raw += os.read(reader.fileno(), noise.nbytes - len(raw))
    thread.join()
    assert bytes(raw) == noise.tobytes()


def test_read_only_arrays_arrive_writable_small_and_big():
    small, big = np.arange(10), np.arange(200_000)
    small.flags.writeable = big.flags.writeable = False
    reader, writer = bmp.Pipe()
    thread = send_in_thread(writer, [small, big])
    got = reader.recv()
    thread.join()
    assert_same_array(small, got[0])
    assert_same_array(big, got[1])


def test_a_process_argument_pickled_in_band_keeps_read_only_arrays_whole():
    small, big = np.arange(10), np.arange(200_000)
    small.flags.writeable = big.flags.writeable = False
    loaded = pickle.loads(transport.cloudpickle_in_band((small, big, lambda: 1), ()))
    assert_same_array(small, loaded[0])
    assert_same_array(big, loaded[1])
    assert loaded[2]() == 1


def test_main_functions_go_by_value_only_when_asked(monkeypatch):
    """The C pickler saves a ``__main__`` function by reference; with ``main_by_value`` (spawn
    and forkserver contexts) cloudpickle saves it by value, so that a child without it gets it."""

    def helper(x):
        return x * 2

    helper.__module__, helper.__qualname__ = "__main__", "blpickle_test_helper"
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "blpickle_test_helper", helper, raising=False)
    wire = transport.wire_options()
    by_reference, _ = transport.pickle_graph(helper, wire, ())
    by_value, _ = transport.pickle_graph(helper, wire, (), main_by_value=True)
    monkeypatch.delattr(main, "blpickle_test_helper")  # as in a child that does not define it
    with pytest.raises(AttributeError):
        pickle.loads(by_reference)
    assert pickle.loads(by_value)(4) == 8


def test_what_the_c_pickler_cannot_pickle_falls_back_to_cloudpickle():
    wire = transport.wire_options()
    scale = 3
    graph, _ = transport.pickle_graph({"f": lambda x: x * scale, "a": [1, 2]}, wire, ())
    assert pickle.loads(graph)["f"](2) == 6
    with pytest.raises(TypeError):  # what neither can pickle raises cloudpickle's error
        transport.pickle_graph(threading.Lock(), wire, ())
    with pytest.raises((pickle.PicklingError, AttributeError)):  # pickler="pickle": no fallback
        transport.pickle_graph(lambda: 1, transport.wire_options(pickler="pickle"), ())


class _SendsWhilePickled:
    """Pickles itself by pickling ``inner`` through `pickle_graph` (a nested pickling)."""

    def __init__(self, inner):
        self.inner = inner

    def __reduce__(self):
        graph, _ = transport.pickle_graph(self.inner, transport.wire_options(), ())
        return pickle.loads, (bytes(graph),)


class _Clears:
    """Clears ``buffer`` when pickled."""

    def __init__(self, buffer):
        self.buffer = buffer

    def __reduce__(self):
        self.buffer[:] = bytes(len(self.buffer))
        return int, (0,)


def test_each_pickling_of_a_thread_stands_alone():
    wire = transport.wire_options(pickler="pickle")
    shared = [1, 2, 3]
    first, _ = transport.pickle_graph([shared, shared], wire, ())
    again, _ = transport.pickle_graph([shared, shared], wire, ())
    assert bytes(first) == bytes(again)  # nothing memoized from the first one
    with pytest.raises(TypeError):
        transport.pickle_graph([shared, threading.Lock()], wire, ())
    after, _ = transport.pickle_graph([shared, shared], wire, ())
    assert bytes(after) == bytes(first)  # a failed pickling leaves nothing behind
    nested, _ = transport.pickle_graph([shared, _SendsWhilePickled({"x": shared}), shared], wire, ())
    assert pickle.loads(nested) == [shared, {"x": shared}, shared]
    big = ["y" * 100_000 for _ in range(30)]  # written in several pieces
    graph, _ = transport.pickle_graph(big, wire, ())
    assert pickle.loads(graph) == big
    array = np.arange(1_000_000)
    sent = weakref.ref(array)
    graph, buffers = transport.pickle_graph(array, wire, ())
    assert len(buffers) == 1
    del array, graph, buffers
    gc.collect()
    assert sent() is None  # the kept pickler holds on to nothing of it
    array = np.arange(1_000_000)
    sent = weakref.ref(array)
    gc.disable()  # a failed pickler is freed at once, without the collector
    try:
        with pytest.raises(TypeError):
            transport.pickle_graph([array, threading.Lock()], wire, ())
        del array
        assert sent() is None
    finally:
        gc.enable()
    payload = bytearray(b"A" * 100_000)  # handed to the file as the object itself
    graph, _ = transport.pickle_graph([payload, _Clears(payload)], wire, ())
    assert pickle.loads(graph)[0] == b"A" * 100_000  # as written, before the reducer changed it


def test_lambda_and_closure_travel():
    reader, writer = bmp.Pipe()
    offset = 7
    writer.send({"f": lambda x: x + offset})
    assert reader.recv()["f"](1) == 8


def test_plain_pickler_option_refuses_lambdas_but_sends_arrays():
    reader, writer = bmp.Pipe(options=transport.wire_options(pickler="pickle"))
    with pytest.raises((pickle.PicklingError, AttributeError)):
        writer.send(lambda: 1)
    array = np.arange(500_000)
    thread = send_in_thread(writer, array)  # the failed send left the connection usable
    assert_same_array(array, reader.recv())
    thread.join()


def test_memmap_arrives_as_a_writable_array(tmp_path):
    mapped = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float64, shape=(300_000,))
    mapped[:] = 1.5
    reader, writer = bmp.Pipe()
    thread = send_in_thread(writer, mapped)
    received = reader.recv()
    thread.join()
    assert type(received) is np.ndarray
    assert_same_array(np.asarray(mapped), received)


def test_receives_plain_multiprocessing_messages():
    reader, writer = bmp.Pipe(duplex=False)
    plain = multiprocessing.connection.Connection(os.dup(writer.fileno()), readable=False)
    plain.send({"a": np.arange(5)})
    got = reader.recv()
    assert list(got["a"]) == [0, 1, 2, 3, 4]
    plain.close()


def test_raw_bytes_methods_are_unchanged():
    reader, writer = bmp.Pipe(duplex=False)
    writer.send_bytes(b"abc")
    assert reader.recv_bytes() == b"abc"
    writer.send_bytes(b"defg")
    buf = bytearray(10)
    assert reader.recv_bytes_into(buf) == 4 and buf[:4] == b"defg"


@pytest.mark.parametrize(
    ("head", "then", "message"),
    [
        (mp_connection.HEAD.pack(mp_connection.MAGIC, 99, 0, 0, 0), b"", "version 99"),
        (mp_connection.HEAD.pack(mp_connection.MAGIC, 2, 0, 0, 1000), b"", "announces 1000 buffers"),
        (mp_connection.MAGIC, b"", "no complete head"),
        (
            mp_connection.HEAD.pack(mp_connection.MAGIC, 2, 0, 0, 1) + mp_connection.DESC.pack(100, 64),
            (10_000).to_bytes(8, "little"),
            "a compressed chunk of 10000 bytes",
        ),
        (
            mp_connection.HEAD.pack(mp_connection.MAGIC, 2, 0, 0, 1) + mp_connection.DESC.pack(100, 1 << 40),
            b"",
            "not a valid transfer",
        ),
    ],
)
def test_a_damaged_message_is_a_clear_error(head, then, message):
    reader, writer = bmp.Pipe(duplex=False)
    writer.send_bytes(head + pickle.dumps(None, protocol=5))
    os.write(writer.fileno(), then)
    with pytest.raises(blpickle.CorruptError, match=message):
        reader.recv()


def _message(nbytes: int, chunk_size: int, then: bytes) -> bmp.Connection:
    """A pipe's reading end holding a message that announces one buffer of ``nbytes`` in
    chunks of ``chunk_size`` (0: raw), followed by ``then``; its writing end closed."""
    reader, writer = bmp.Pipe(duplex=False)
    head = mp_connection.HEAD.pack(mp_connection.MAGIC, 2, 0, 0, 1) + mp_connection.DESC.pack(nbytes, chunk_size)
    writer.send_bytes(head + pickle.dumps(None, protocol=5))
    os.write(writer.fileno(), then)
    writer.close()
    return reader


def test_sizes_a_peer_announces_allocate_only_what_arrived():
    """A compressed chunk announced as 2 GiB followed by 40 bytes, a raw buffer of 2 GiB
    followed by 40 bytes: receiving allocates at most 8 MiB before the pipe ends."""
    chunk = (1 << 31).to_bytes(8, "little") + bytes(40)
    for nbytes, chunk_size, then in ((1 << 31, 1 << 31, chunk), (1 << 31, 0, bytes(40))):
        reader = _message(nbytes, chunk_size, then)

        def receive(reader=reader):
            with pytest.raises(OSError, match="end of file"):
                reader.recv()

        assert peak_allocated(receive) < 9 << 20


def test_a_buffer_too_large_to_allocate_is_a_limit_error():
    """A raw buffer of 2**60 bytes, its first 8 MiB sent: a LimitError, not a MemoryError."""
    reader, writer = bmp.Pipe(duplex=False)
    head = mp_connection.HEAD.pack(mp_connection.MAGIC, 2, 0, 0, 1) + mp_connection.DESC.pack(1 << 60, 0)
    writer.send_bytes(head + pickle.dumps(None, protocol=5))
    sender = threading.Thread(target=lambda: os.write(writer.fileno(), bytes(transport.FIRST_READ)))
    sender.start()
    with pytest.raises(blpickle.LimitError, match="a raw buffer announces"):
        reader.recv()
    sender.join()


def test_eof_when_the_peer_closes():
    reader, writer = bmp.Pipe(duplex=False)
    writer.close()
    with pytest.raises(EOFError):
        reader.recv()


def test_context_basics():
    ctx = bmp.get_context("spawn", codec="zstd")
    assert ctx.get_start_method() == "spawn"
    assert ctx.get_context() is ctx
    assert ctx.get_context("fork").get_start_method() == "fork"
    assert ctx.get_context("fork").wire_options == ctx.wire_options
    assert ctx.wire_options.options.codec == "zstd"
    assert ctx.wire_options.options.pickler == "cloudpickle"
    with pytest.raises(ValueError, match="nonsense"):
        bmp.get_context("nonsense")
    with pytest.raises(blpickle.OptionsError):
        bmp.get_context("fork", compress="sometimes")
    with pytest.raises(blpickle.OptionsError):
        bmp.get_context("fork", clevel=42)
    assert bmp.get_context(preset="raw").wire_options.compresses is False


def test_install_and_uninstall():
    original = multiprocessing.Pool
    try:
        ctx = bmp.install("fork")
        assert multiprocessing.Pool == ctx.Pool
        assert isinstance(multiprocessing.Pipe()[0], bmp.Connection)
    finally:
        bmp.uninstall()
    assert multiprocessing.Pool is original


def test_queue_timeouts_and_order():
    q = bmp.get_context("fork").Queue()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    for i in range(50):
        q.put(np.full(100_000, i))
    assert [int(q.get(timeout=10)[0]) for _ in range(50)] == list(range(50))
    q.close()
    q.join_thread()


def test_queue_reports_pickling_errors_and_keeps_working(monkeypatch):
    errors = []
    monkeypatch.setattr(
        multiprocessing.queues.Queue, "_on_queue_feeder_error", lambda self, exc, obj: errors.append((exc, obj))
    )
    q = bmp.get_context("fork").Queue()
    unpicklable = threading.Lock()
    q.put(unpicklable)
    q.put("after")
    assert q.get(timeout=10) == "after"
    assert len(errors) == 1 and errors[0][1] is unpicklable


# --- across processes --------------------------------------------------------------------------


def echo(obj):
    return obj


def describe(array):
    return type(array).__name__, array.flags.writeable, float(array.sum())


def queue_worker(inbox, outbox):
    while True:
        item = inbox.get()
        if item is None:
            break
        outbox.put(item)


def pipe_worker(conn):
    conn.send(conn.recv())
    conn.close()


@pytest.fixture(scope="module", params=METHODS)
def pool(request):
    ctx = bmp.get_context(request.param, nthreads=2)
    with ctx.Pool(2) as pool:
        yield pool


def test_pool_map_round_trip(pool):
    objects = sample_objects()
    results = pool.map(echo, [objects, objects["compressible"]])
    check_objects(objects, results[0])
    assert_same_array(objects["compressible"], results[1])
    assert pool.map(describe, [objects["random"]]) == [("ndarray", True, float(objects["random"].sum()))]


def test_pool_lambdas_and_errors(pool):
    scale = 3
    assert pool.map(lambda x: x * scale, range(5)) == [0, 3, 6, 9, 12]
    with pytest.raises(ZeroDivisionError):
        pool.apply(lambda: 1 / 0)
    with pytest.raises(TypeError):  # an unpicklable argument fails in the parent
        pool.apply(echo, (threading.Lock(),))
    assert pool.apply(echo, ("still working",)) == "still working"
    assert list(pool.imap(lambda a: a.sum(), [np.ones(300_000)] * 3)) == [300_000.0] * 3


@pytest.mark.parametrize("method", METHODS)
def test_process_pool_executor(method):
    ctx = bmp.get_context(method, nthreads=2)
    objects = sample_objects()
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as executor:
        future = executor.submit(echo, objects)
        check_objects(objects, future.result(timeout=60))
        # a lambda as the function: the call queue sends arguments with blpickle (cloudpickle)
        assert list(executor.map(lambda a: a[0] + 1, [np.arange(5, 500_005)] * 3)) == [6] * 3
        bad = executor.submit(echo, threading.Lock())  # fails in the feeder thread
        with pytest.raises(TypeError):
            bad.result(timeout=60)
        assert executor.submit(echo, 41).result(timeout=60) == 41


def _fail_in_the_feeder() -> None:
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=bmp.get_context("fork")) as executor:
        assert executor.submit(echo, 1).result(timeout=60) == 1
        bad = executor.submit(echo, threading.Lock())
        with pytest.raises(TypeError):
            bad.result(timeout=60)
    # bad holds the error, whose traceback holds this frame, which holds bad: a cycle


def test_a_pickling_error_in_the_feeder_leaves_no_buffer_exported(monkeypatch):
    """The executor keeps the feeder's pickling error (and its traceback's frames) in the
    future: collecting them must not find a BytesIO whose buffer is still exported."""
    gc.collect()  # the garbage of earlier tests first
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    _fail_in_the_feeder()
    gc.collect()
    assert unraisable == []


@pytest.mark.parametrize("method", METHODS)
def test_queues_and_pipes_to_a_process(method):
    ctx = bmp.get_context(method, nthreads=2)
    objects = sample_objects()
    inbox, outbox = ctx.Queue(), ctx.SimpleQueue()
    process = ctx.Process(target=queue_worker, args=(inbox, outbox))
    process.start()
    inbox.put(objects)
    inbox.put(lambda: "from a lambda")
    inbox.put(None)
    check_objects(objects, outbox.get())
    assert outbox.get()() == "from a lambda"
    process.join(timeout=60)
    assert process.exitcode == 0

    parent, child = ctx.Pipe()
    process = ctx.Process(target=pipe_worker, args=(child,))
    process.start()
    thread = send_in_thread(parent, objects)
    check_objects(objects, parent.recv())
    thread.join()
    process.join(timeout=60)
    assert process.exitcode == 0


def test_joinable_queue():
    ctx = bmp.get_context("fork")
    q = ctx.JoinableQueue()
    q.put(np.arange(400_000))
    got = q.get(timeout=10)
    q.task_done()
    q.join()
    assert_same_array(np.arange(400_000), got)


# --- scripts: __main__ functions, and processes forked while threads compress ------------------


def run_script(tmp_path, code: str, timeout: float = 120) -> str:
    """Run ``code`` as a ``__main__`` script; on a hang kill it with all its children."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"the script hung for {timeout} s")
    assert process.returncode == 0, stderr
    return stdout


def test_functions_and_lambdas_defined_in_main(tmp_path):
    """As with loky: functions, classes and lambdas of a ``__main__`` script are pool
    functions, executor calls, process targets and initializers under spawn and forkserver."""
    out = run_script(
        tmp_path,
        """
        import concurrent.futures
        import numpy as np
        from blpickle.integrations import multiprocessing as bmp

        def triple(a):
            return a * 3

        class Box:
            def __init__(self, value):
                self.value = value

        if __name__ == "__main__":
            data = np.arange(1_000_000)
            for method in ("spawn", "forkserver"):
                ctx = bmp.get_context(method)
                with ctx.Pool(1, initializer=lambda: None) as pool:
                    assert (pool.map(triple, [data])[0] == data * 3).all()
                    assert pool.apply(lambda b: b.value + 1, (Box(1),)) == 2
                with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as ex:
                    assert ex.submit(lambda: Box(5)).result().value == 5
                    assert (ex.submit(triple, data).result() == data * 3).all()
                queue = ctx.Queue()
                process = ctx.Process(target=lambda q: q.put(method), args=(queue,))
                process.start()
                print(queue.get(timeout=60))
                process.join()
        """,
    )
    assert out.split() == ["spawn", "forkserver"]


def test_forked_workers_never_hang_on_blosc2_threads(tmp_path):
    """Workers forked while the parent holds a live multi-threaded Blosc2 global context and
    compresses in threads (core dump/load, global blosc2.compress) receive and send compressed
    arrays, and dump and load: blpickle only uses single-threaded Blosc2 contexts."""
    out = run_script(
        tmp_path,
        """
        import threading, warnings
        import blosc2, numpy as np
        import blpickle
        from blpickle.integrations import multiprocessing as bmp

        warnings.simplefilter("ignore", DeprecationWarning)
        data = np.arange(2_000_000)
        blosc2.set_nthreads(2)  # a child using this global context after fork would hang
        blosc2.compress(data, typesize=8)
        stop = threading.Event()

        def churn():
            while not stop.is_set():
                blpickle.loads(blpickle.dumps(data, nthreads=2, chunk_size=1 << 18), nthreads=2)
                blosc2.decompress(blosc2.compress(data, typesize=8))

        def work(a):  # the core dump/load in the child too
            return blpickle.loads(blpickle.dumps(a * 2, nthreads=2, chunk_size=1 << 18), nthreads=2)

        if __name__ == "__main__":
            threads = [threading.Thread(target=churn) for _ in range(2)]
            for t in threads:
                t.start()
            ctx = bmp.get_context("fork", nthreads=2, compress=True, chunk_size=1 << 20)
            for _ in range(3):
                with ctx.Pool(2, maxtasksperchild=1) as pool:  # a new fork for every task
                    results = pool.map(work, [data] * 4, chunksize=1)
                    assert all((r == data * 2).all() for r in results)
            stop.set()
            for t in threads:
                t.join()
            print("ok")
        """,
        timeout=120,
    )
    assert out.strip() == "ok"
