"""Raw loaders: data root, md5 checks, IDX decoding, digits, and opt-in download (tested
only against a local server on 127.0.0.1 serving generated files)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import socket
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.data import idx, root
from fedshift.data.digits import load_digits
from fedshift.data.idx import load_fashion_mnist, load_idx_dataset, load_mnist, read_idx
from fedshift.data.root import DatasetFiles, data_root, dataset_files, file_md5
from fedshift.errors import FedshiftError


def _one_sentence(msg: str) -> bool:
    return "\n" not in msg and "Traceback" not in msg and msg.count(". ") == 0


# ---------------------------------------------------------------- data root


def test_data_root_order(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSHIFT_DATA", str(tmp_path / "env"))
    assert data_root(tmp_path / "explicit") == tmp_path / "explicit"
    assert data_root() == tmp_path / "env"
    monkeypatch.delenv("FEDSHIFT_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == tmp_path / "home" / ".cache" / "fedshift"


# ---------------------------------------------------------------- real files


@pytest.mark.parametrize(
    "loader, n_train, n_test", [(load_mnist, 60_000, 10_000), (load_fashion_mnist, 60_000, 10_000)]
)
def test_real_idx_files(shared_datasets, loader, n_train, n_test):
    x, y = loader(shared_datasets, train=True)
    assert x.shape == (n_train, 28, 28) and x.dtype == torch.uint8
    assert y.shape == (n_train,) and y.dtype == torch.int64
    assert set(y.unique().tolist()) == set(range(10))
    assert int(x.max()) == 255
    tx, ty = loader(shared_datasets, train=False)
    assert tx.shape == (n_test, 28, 28) and ty.shape == (n_test,)


def test_real_files_have_canonical_md5(shared_datasets):
    for key in ("mnist", "fashion_mnist"):  # the datasets shared/datasets holds
        spec = root.DATASETS[key]
        paths = dataset_files(key, data_dir=shared_datasets)
        for name, path in paths.items():
            assert file_md5(path) == spec.md5[name]


def test_fmnist_alias_and_env_var(shared_datasets, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_DATA", str(shared_datasets))
    x, y = load_idx_dataset("fmnist", "test")
    assert x.shape == (10_000, 28, 28)
    assert torch.bincount(y).tolist() == [1000] * 10  # Fashion-MNIST test is balanced


def test_loaders_return_copies(shared_datasets):
    x1, _ = load_mnist(shared_datasets, train=False)
    x1.zero_()
    x2, _ = load_mnist(shared_datasets, train=False)
    assert int(x2.max()) == 255


def test_md5_computed_once(shared_datasets, monkeypatch):
    dataset_files("mnist", data_dir=shared_datasets)  # warm the cache
    calls = []
    monkeypatch.setattr(hashlib, "md5", lambda *a: calls.append(a) or None)
    dataset_files("mnist", data_dir=shared_datasets)
    assert calls == []


# ---------------------------------------------------------------- generated IDX


def _idx_bytes(arr: np.ndarray) -> bytes:
    head = bytes([0, 0, 0x08, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
    return head + arr.astype(np.uint8).tobytes()


def _write_mnist_like(
    folder: Path, n: int, gz: bool, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=n, dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in (("t10k-images-idx3-ubyte", x), ("t10k-labels-idx1-ubyte", y)):
        data = _idx_bytes(arr)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return x, y


def test_raw_idx_loads(tmp_path):
    x, y = _write_mnist_like(tmp_path / "mnist", 10_000, gz=False)
    tx, ty = load_mnist(tmp_path, train=False)
    assert torch.equal(tx, torch.from_numpy(x)) and torch.equal(ty, torch.from_numpy(y).long())


def test_raw_idx_with_wrong_count_is_refused(tmp_path):
    _write_mnist_like(tmp_path / "mnist", 100, gz=False)
    with pytest.raises(FedshiftError, match="expected 10000"):
        load_mnist(tmp_path, train=False)


def test_read_idx_checks_magic_and_length(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(FedshiftError, match="magic"):
        read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(_idx_bytes(np.zeros((5, 2), np.uint8))[:-3])
    with pytest.raises(FedshiftError, match="truncated"):
        read_idx(short)
    gz = tmp_path / "ok.whatever"
    gz.write_bytes(gzip.compress(_idx_bytes(np.arange(6, dtype=np.uint8).reshape(2, 3))))
    assert read_idx(gz).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_damaged_idx_files_are_one_sentence(tmp_path):
    """The issue's cases: a damaged deflate stream (zlib.error), dimensions whose product
    wraps a 64-bit integer, and 255 dimensions."""
    data = gzip.compress(_idx_bytes(np.arange(600, dtype=np.uint8).reshape(20, 30)))
    broken = tmp_path / "deflate.gz"
    broken.write_bytes(data[:12] + bytes(b ^ 0x5A for b in data[12:40]) + data[40:])
    with pytest.raises(FedshiftError, match="cannot read IDX file"):
        read_idx(broken)
    wrapped = tmp_path / "wrapped"  # 2^32 × 2^32 items: 0 in int64 arithmetic
    wrapped.write_bytes(b"\x00\x00\x08\x03" + (2**32 - 1).to_bytes(4, "big") * 3 + b"\x00")
    with pytest.raises(FedshiftError, match="truncated or corrupt"):
        read_idx(wrapped)
    deep = tmp_path / "deep"
    deep.write_bytes(b"\x00\x00\x08\xff" + (1).to_bytes(4, "big") * 255 + b"\x07")
    with pytest.raises(FedshiftError, match="255 dimensions"):
        read_idx(deep)


def test_missing_files_error_is_one_sentence(tmp_path):
    with pytest.raises(FedshiftError) as err:
        load_mnist(tmp_path, train=True)
    msg = str(err.value)
    assert "train-images-idx3-ubyte.gz" in msg and "train-labels-idx1-ubyte.gz" in msg
    assert str(tmp_path / "mnist") in msg
    assert "FEDSHIFT_DATA" in msg and "download" in msg
    assert _one_sentence(msg)


def test_gz_with_wrong_md5_is_refused(tmp_path):
    _write_mnist_like(tmp_path / "mnist", 10_000, gz=True)
    with pytest.raises(FedshiftError) as err:
        load_mnist(tmp_path, train=False)
    msg = str(err.value)
    assert "md5" in msg and "t10k-images-idx3-ubyte.gz" in msg
    assert root.DATASETS["mnist"].md5["t10k-images-idx3-ubyte.gz"] in msg
    assert _one_sentence(msg)


def test_digits():
    x, y = load_digits()
    assert x.shape == (1797, 8, 8) and y.shape == (1797,)
    assert x.dtype == torch.float32 and 0.0 <= float(x.min()) and float(x.max()) == 1.0
    tr, te = load_digits("train"), load_digits("test")
    assert len(tr[1]) + len(te[1]) == 1797 and torch.equal(te[0], x[len(tr[1]) :])
    with pytest.raises(FedshiftError):
        load_digits("nope")


# ---------------------------------------------------------------- download


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_dir(tmp_path):
    """(folder served, base URL) of an http.server on 127.0.0.1."""
    served = tmp_path / "served"
    served.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_Quiet, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/"


def _generated_spec(served: Path, mirrors: tuple[str, ...]) -> DatasetFiles:
    _write_mnist_like(served, 10_000, gz=True, seed=1)
    md5 = {
        name: hashlib.md5((served / name).read_bytes()).hexdigest()
        for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    }
    return DatasetFiles("MNIST", "mnist", md5, mirrors, root._idx_raw_names(md5))


def test_download_from_local_server(http_dir, tmp_path, monkeypatch):
    served, url = http_dir
    spec = _generated_spec(served, (_closed_port_url(), url + "missing/", url))
    monkeypatch.setitem(root.DATASETS, "mnist", spec)
    data = tmp_path / "root"
    with pytest.raises(FedshiftError, match="not found"):
        load_mnist(data, train=False)  # download is off by default
    x, y = load_mnist(data, train=False, download=True)
    assert x.shape == (10_000, 28, 28)
    files = sorted(p.name for p in (data / "mnist").iterdir())
    assert files == ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]  # no temp left
    x2, _ = load_mnist(data, train=False)  # now present offline
    assert torch.equal(x, x2)


def test_download_failures_are_clear(http_dir, tmp_path):
    served, url = http_dir
    spec = _generated_spec(served, (url + "nowhere/", _closed_port_url()))
    with pytest.raises(FedshiftError) as err:
        dataset_files(spec, ["t10k-labels-idx1-ubyte.gz"], tmp_path, download=True)
    msg = str(err.value)
    assert "could not download" in msg and "404" in msg and str(tmp_path / "mnist") in msg
    assert _one_sentence(msg)
    assert not any((tmp_path / "mnist").iterdir())  # nothing half-written

    (served / "bad").mkdir()
    (served / "bad" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not the canonical file")
    with pytest.raises(FedshiftError, match="md5"):
        dataset_files(
            replace(spec, mirrors=(url + "bad/",)),
            ["t10k-labels-idx1-ubyte.gz"],
            tmp_path,
            download=True,
        )
    assert not any((tmp_path / "mnist").iterdir())


def test_idx_module_caches_decoding(shared_datasets):
    load_mnist(shared_datasets, train=False)
    before = idx._decode.cache_info().hits
    load_mnist(shared_datasets, train=False)
    assert idx._decode.cache_info().hits == before + 1
