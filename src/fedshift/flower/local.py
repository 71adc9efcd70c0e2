"""A Flower deployment on this machine: one SuperLink and N SuperNodes as subprocesses,
bound to 127.0.0.1 only, optionally with TLS and SuperNode authentication. Used by the
tests and the benchmark, and handy to try ``fedshift flower run --deployment`` locally::

    with LocalFederation(3, folder, tls=True, auth=True) as fed:
        deploy(configs, address=fed.address, root_certificates=fed.ca)

Every process is started in its own session; ``stop()`` (also on any error, and on exit
of the ``with`` block) sends SIGTERM to each process group, then SIGKILL to what remains.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import FedshiftError
from . import credentials
from .run import QUIET_ENV, flwr_executable

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else name


class LocalFederation:
    def __init__(
        self,
        num_nodes: int,
        folder: str | Path,
        *,
        tls: bool = False,
        auth: bool = False,
        node_config: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if auth and not tls:
            raise FedshiftError("SuperNode authentication needs TLS")
        self.n = num_nodes
        self.folder = Path(folder)
        self.tls, self.auth = tls, auth
        self.node_config = node_config or {}
        self.env = {**os.environ, **QUIET_ENV, **(env or {})}
        self.port = free_port()
        self.address = f"{HOST}:{self.port}"
        self.link: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        self.ca: Path | None = None
        self.keys: list[tuple[Path, Path]] = []
        self.cli_home = self.folder / "flwr-cli"

    # processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        home = self.folder / f"home-{name}"
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        try:
            return subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.env, "FLWR_HOME": str(home)},
                cwd=self.folder,
                start_new_session=True,
            )
        finally:
            log.close()

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> LocalFederation:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        link = [_exe("flower-superlink"), "--host", HOST, "--port", str(self.port)]
        link.append("--disable-runtime-dependency-installation")
        if self.tls:
            paths = credentials.tls(self.folder / "certificates")
            self.ca = paths["ca"]
            link += ["--ssl-ca-certfile", str(paths["ca"]), "--ssl-certfile", str(paths["cert"])]
            link += ["--ssl-keyfile", str(paths["key"])]
        else:
            link.append("--insecure")
        if self.auth:
            link.append("--enable-supernode-auth")
            self.keys = credentials.node_keys(self.folder / "keys", self.n)
        self.link = self._spawn("superlink", link)
        self._wait_port(self.port, "SuperLink")
        self._write_cli_config()
        for _private, public in self.keys:
            self.register(public)
        for i in range(self.n):
            self.start_node(i)

    def start_node(self, i: int, key: Path | None = None, name: str | None = None) -> None:
        """Start the SuperNode of client ``i`` (``key``: another private key, e.g. one
        that was never registered)."""
        cmd = [_exe("flower-supernode"), "--superlink", self.address]
        cmd += ["--port", str(free_port()), "--host", HOST]
        cmd += ["--node-config", f"partition-id={i} num-partitions={self.n}"]
        for k, v in self.node_config.items():
            cmd[-1] += f" {k}={v!r}" if isinstance(v, str) else f" {k}={v}"
        if self.tls:
            cmd += ["--root-certificates", str(self.ca)]
        else:
            cmd.append("--insecure")
        if key is None and self.auth:
            key = self.keys[i][0]
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        self.nodes[i if name is None else name] = self._spawn(name or f"supernode-{i}", cmd)

    def _write_cli_config(self) -> None:
        import tomli_w

        conn: dict = {"address": self.address}
        if self.tls:
            conn["root-certificates"] = str(self.ca)
        else:
            conn["insecure"] = True
        self.cli_home.mkdir(parents=True, exist_ok=True)
        text = tomli_w.dumps({"superlink": {"default": "local-fed", "local-fed": conn}})
        (self.cli_home / "config.toml").write_text(text)

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this federation."""
        return subprocess.run(
            [flwr_executable(), *args],
            env={**self.env, "FLWR_HOME": str(self.cli_home)},
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def register(self, public_key: Path) -> None:
        out = self.flwr("supernode", "register", str(public_key), "local-fed")
        if out.returncode != 0:
            raise FedshiftError(f"could not register {public_key.name}: {out.stdout}{out.stderr}")

    def _wait_port(self, port: int, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.link is not None and self.link.poll() is not None:
                raise FedshiftError(f"{what} exited: {self.log('superlink')[-2000:]}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((HOST, port)) == 0:
                    return
            time.sleep(0.2)
        raise FedshiftError(f"{what} did not listen on {HOST}:{port} within {timeout:.0f} s")

    @staticmethod
    def _terminate(procs: list[subprocess.Popen], grace: float = 10) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group: SuperExec and ClientApp/ServerApp children too
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def kill_node(self, i) -> None:
        """SIGKILL a SuperNode and its children (failure injection)."""
        p = self.nodes[i]
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def stop(self) -> None:
        self._terminate(list(self.nodes.values()))
        if self.link is not None:
            self._terminate([self.link])

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
