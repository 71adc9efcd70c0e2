"""Where raw dataset files live, and making sure the right ones are there.

The data root is the explicit ``data_dir`` (the CLI's ``--data-dir``), else the
``FEDSHIFT_DATA`` environment variable, else ``~/.cache/fedshift``. Dataset ``d`` lives in
``<root>/<folder>/`` (``mnist``, ``fashion_mnist``), the layout of ``shared/datasets``, so
pointing the root there just works. Compressed files are accepted only with their
canonical md5 (the checksum is computed once per file per process); downloading is opt-in,
atomic (temporary file + rename) and checked against the same md5.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FedshiftError

ENV_VAR = "FEDSHIFT_DATA"
DEFAULT_ROOT = "~/.cache/fedshift"
DOWNLOAD_TIMEOUT_S = 30.0


def data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """The data root: ``data_dir``, else ``$FEDSHIFT_DATA``, else ``~/.cache/fedshift``."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR, "")
    if env:
        return Path(env).expanduser()
    return Path(DEFAULT_ROOT).expanduser()


@dataclass(frozen=True)
class DatasetFiles:
    """The files of one dataset: folder under the root, canonical md5s, download mirrors.

    A file is fetched from ``mirror + name`` for each mirror in turn. ``raw_names`` lists,
    for a compressed file, the names its un-compressed copy may have (no md5 is known for
    those, so their readers must check the contents instead). An md5 of ``None`` means no
    canonical checksum is published for that file: its reader checks the structure.
    Names may contain ``/`` (files in a sub-folder). With ``archive = (name, md5)`` the
    files are not downloaded one by one: the archive is fetched from the mirrors (checked
    against its md5) and unpacked into the folder (tar, tar.gz or zip).
    """

    title: str
    folder: str
    md5: Mapping[str, str | None]
    mirrors: tuple[str, ...] = ()
    raw_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    archive: tuple[str, str] | None = None
    layout: str = ""  # shown in the missing-files error, e.g. "cifar-10-batches-py/…"


def _idx_raw_names(files: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    # "train-images-idx3-ubyte.gz" -> "train-images-idx3-ubyte" (and the original
    # "train-images.idx3-ubyte" spelling of the uncompressed release)
    out = {}
    for name in files:
        stem = name.removesuffix(".gz")
        out[name] = (stem, stem.replace("-idx", ".idx", 1))
    return out


_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
_FASHION_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

# Keyed by dataset name; tests replace entries (e.g. to point mirrors at a local server).
DATASETS: dict[str, DatasetFiles] = {
    "mnist": DatasetFiles(
        "MNIST",
        "mnist",
        _MNIST_MD5,
        (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        _idx_raw_names(_MNIST_MD5),
    ),
    "fashion_mnist": DatasetFiles(
        "Fashion-MNIST",
        "fashion_mnist",
        _FASHION_MD5,
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        _idx_raw_names(_FASHION_MD5),
    ),
}

# (resolved path, size, mtime_ns) -> md5 hex digest
_MD5_CACHE: dict[tuple[str, int, int], str] = {}


def file_md5(path: Path) -> str:
    """md5 of ``path``, computed once per process for an unchanged file."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _MD5_CACHE:
        h = hashlib.md5()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _MD5_CACHE[key] = h.hexdigest()
    return _MD5_CACHE[key]


def _check_md5(path: Path, expected: str | None, title: str) -> None:
    if expected is None:  # no canonical checksum: the reader checks the structure
        return
    got = file_md5(path)
    if got != expected:
        raise FedshiftError(
            f"{title} file {path} has md5 {got} but the canonical file has {expected}; "
            "replace it with the canonical file (or delete it and allow downloading)"
        )


def _download(spec: DatasetFiles, name: str, folder: Path, expected: str | None = None) -> Path:
    """Fetch ``name`` into ``folder`` from the first mirror that serves the canonical file
    (md5 ``expected``, by default the spec's; ``None``: any file, the reader checks it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FedshiftError(f"cannot create {folder} to download {name} into ({e})") from None
    if expected is None:
        expected = spec.md5.get(name)
    errors = []
    for mirror in spec.mirrors:
        url = mirror + name
        tmp = None
        try:
            h = hashlib.md5()
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
                fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
                with os.fdopen(fd, "wb") as out:
                    for block in iter(lambda r=resp: r.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
            if expected is not None and h.hexdigest() != expected:
                errors.append(f"{url} gave md5 {h.hexdigest()}, expected {expected}")
                continue
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            tmp = None
            return target
        except urllib.error.HTTPError as e:
            errors.append(f"{url}: HTTP {e.code} {e.reason}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"{url}: {getattr(e, 'reason', None) or e}")
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
    tried = "; ".join(errors) if errors else "no download address is known"
    raise FedshiftError(
        f"could not download {spec.title} file {name} into {folder} ({tried}), so put the "
        f"file there yourself or point the data root elsewhere ({ENV_VAR} or --data-dir)"
    )


def _locate(
    spec: DatasetFiles, names: list[str], folder: Path
) -> tuple[dict[str, Path], list[str]]:
    """Each name's file in ``folder`` (its canonical name, else an un-compressed copy) and
    the names with neither."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in names:
        candidates = (name, *spec.raw_names.get(name, ()))
        path = next((folder / c for c in candidates if (folder / c).is_file()), None)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    return found, missing


def missing_files(dataset: str, data_dir: str | os.PathLike | None = None) -> list[str]:
    """The dataset's files that are under the data root neither as published nor
    un-compressed (checks presence only, no checksum)."""
    spec = DATASETS[dataset]
    return _locate(spec, list(spec.md5), data_root(data_dir) / spec.folder)[1]


def dataset_files(
    dataset: str | DatasetFiles,
    names: list[str] | tuple[str, ...] | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> dict[str, Path]:
    """Paths of the dataset's files ``names`` (default: all), verified or downloaded.

    A compressed file must have its canonical md5. Where only an un-compressed copy (see
    ``DatasetFiles.raw_names``) is present, its path is returned unverified and the reader
    must check the contents. Missing files are downloaded only when ``download`` is true;
    otherwise one :class:`FedshiftError` names every missing file and where to put it.
    """
    spec = DATASETS[dataset] if isinstance(dataset, str) else dataset
    names = list(spec.md5) if names is None else list(names)
    folder = data_root(data_dir) / spec.folder
    found, missing = _locate(spec, names, folder)
    for name, path in found.items():
        if path == folder / name:  # the file as published: its md5 is known
            _check_md5(path, spec.md5[name], spec.title)
    if missing and download:
        if spec.archive is not None:
            _fetch_archive(spec, folder)
            return dataset_files(spec, names, data_dir, download=False)
        for name in missing:
            found[name] = _download(spec, name, folder)
        missing = []
    if missing:
        them = "them" if len(missing) > 1 else "it"
        how = spec.layout or "gzipped or not"
        raise FedshiftError(
            f"{spec.title} file{'s' if len(missing) > 1 else ''} {', '.join(missing)} not "
            f"found in {folder}; put {them} there ({how}), point the data root at a "
            f"folder holding {spec.folder}/ ({ENV_VAR} or --data-dir), or allow downloading "
            "(download=True, on the CLI --set scenario.download=true)"
        )
    return {name: found[name] for name in names}


def _fetch_archive(spec: DatasetFiles, folder: Path) -> None:
    """Download ``spec.archive`` (md5-checked) into ``folder`` and unpack it there."""
    name, md5 = spec.archive
    path = folder / name
    if not (path.is_file() and file_md5(path) == md5):
        path = _download(spec, name, folder, md5)
    extract_archive(path, folder)


def extract_archive(path: Path, into: Path) -> None:
    """Unpack a tar / tar.gz / zip archive into ``into``, refusing members that would land
    outside it (absolute paths, ``..``, links)."""
    import zipfile

    into = into.resolve()

    def safe(member: str) -> None:
        target = (into / member).resolve()
        if into != target and into not in target.parents:
            raise FedshiftError(f"archive {path} holds {member!r}, which lies outside {into}")

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for m in z.namelist():
                    safe(m)
                z.extractall(into)
            return
        with tarfile.open(path) as t:
            members = t.getmembers()
            for m in members:
                safe(m.name)
                if not (m.isfile() or m.isdir()):
                    raise FedshiftError(f"archive {path} holds {m.name!r}, not a file or folder")
            if hasattr(tarfile, "data_filter"):  # Python ≥ 3.11.4: also strip odd modes
                t.extractall(into, members=members, filter="data")
            else:
                t.extractall(into, members=members)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise FedshiftError(f"cannot unpack {path} ({e})") from None
