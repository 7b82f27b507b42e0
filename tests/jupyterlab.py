"""JupyterLab driven by a real headless browser: the harness the browser tests share (issue #31).

A JupyterLab server from the environment the tests run in (``sys.executable``'s venv) listens on 127.0.0.1,
on a free port, behind a token (:func:`started_lab`); its kernels talk over IPC sockets, not TCP, and get
this checkout's bbrlab first on their path. Debian's chromium, headless, is driven by Debian's chromedriver
through Selenium (:func:`opened_browser`). Both are stopped on every way out, and what they started is
checked to be gone. The page is read in one go per question (:func:`read_page`): the page changes while a
kernel runs. :func:`error_outputs` is the checker of what the page shows as an error.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.polling import wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
KERNEL = "bbrlab"
KERNEL_DISPLAY_NAME = "bbrlab (.venv)"
ROOT = Path(__file__).parents[1]
WINDOW = (1500, 1300)  # tall enough for the picker and its whole figure
#: The notebook on show (JupyterLab keeps other tabs in the page, hidden).
SHOWN = ".jp-NotebookPanel:not(.lm-mod-hidden)"
#: What JupyterLab renders an error output, a stderr stream or a failed renderer as.
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
SERVER_START_S = 120
NOTEBOOK_RUN_S = 300


# -- processes and sockets, read from /proc ----------------------------------------------------------------

def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (the state first), or [] when there is no PID."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): tells a process from a later one with its pid."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            parent[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


@dataclass
class Processes:
    """The processes of trees, remembered by (pid, start time), so they can be checked after their root is gone."""

    seen: set[tuple[int, int]] = field(default_factory=set)

    def note(self, *roots: int) -> set[int]:
        """Remember ``roots`` and all their descendants now; returns their pids."""
        tree = set(roots).union(*(descendants(p) for p in roots))
        self.seen |= {(p, t) for p in tree if (t := _start_time(p)) is not None}
        return tree

    def running(self) -> list[int]:
        """Those still running (a zombie has ended: only its parent's wait is missing)."""
        return sorted(p for p, t in self.seen if _start_time(p) == t and _stat(p)[0] != "Z")

    def stop_leftovers(self, grace_s: float = 15) -> list[str]:
        """Give the processes ``grace_s`` to end, then SIGKILL those still running; returns those (pid and
        command line)."""
        end = time.monotonic() + grace_s
        while self.running() and time.monotonic() < end:
            time.sleep(0.1)
        left = []
        for pid in self.running():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            left.append(f"{pid} {cmdline}")
        return left


@dataclass(frozen=True)
class Listener:
    proto: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    pid: int

    @property
    def loopback(self) -> bool:
        mapped = getattr(self.address, "ipv4_mapped", None)
        return self.address.is_loopback or (mapped is not None and mapped.is_loopback)


def listeners(pids: set[int]) -> list[Listener]:
    """The TCP sockets in LISTEN and the bound UDP sockets that ``pids`` hold (from /proc/net)."""
    owner = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[int(target[8:-1])] = pid
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        listening = "0A" if proto.startswith("tcp") else "07"  # TCP_LISTEN; TCP_CLOSE is how a bound UDP socket shows
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            inode = int(fields[9])
            if inode in owner and fields[3] == listening:
                host, port = fields[1].split(":")
                raw = bytes.fromhex(host)  # 32-bit words in host (little-endian) order
                address = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
                found.append(Listener(proto, address, int(port, 16), owner[inode]))
    return found


# -- the JupyterLab server ---------------------------------------------------------------------------------

@dataclass
class Lab:
    url: str
    port: int
    token: str
    root: Path
    log: Path
    proc: subprocess.Popen
    processes: Processes

    def api(self, method: str, path: str, timeout_s: float = 10):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_environment(home: Path, runtime: Path) -> dict[str, str]:
    """The server's environment (its kernels inherit it): this checkout's bbrlab first on the path; Jupyter's
    config, data, settings and workspaces in ``home`` and its runtime files (connection files, the kernels'
    IPC sockets) in ``runtime``, so that neither the user's files nor a kernel named bbrlab in ~/.local
    shadow the environment's own, and nothing is left behind."""
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("IPYTHONDIR", "ipython"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        (home / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        env[var] = str(home / sub)
    # No news or update checks: they would ask the internet, and their toast would cover the screenshot.
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                            "checkForUpdates": False}))
    return env


def stop_lab(lab: Lab) -> None:
    """Shut the server down through its API (it shuts its kernels down first), else by signal."""
    lab.processes.note(lab.proc.pid)
    try:
        lab.api("POST", "/api/shutdown")
    except (OSError, urllib.error.URLError):
        pass
    try:
        lab.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(lab.proc.pid, signal.SIGTERM)
        try:
            lab.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(lab.proc.pid, signal.SIGKILL)
            lab.proc.wait()


@contextmanager
def started_lab(lab_root: Path, home: Path) -> Iterator[Lab]:
    """A JupyterLab server on 127.0.0.1 (a free port, a token) with its root in ``lab_root`` and Jupyter's own
    files in ``home``; shut down, and checked to leave no process, when the block ends."""
    # An IPC socket's path must stay under 108 bytes, and the kernels' are named after their connection
    # files: pytest's folders can be longer, so the runtime folder is a short one of its own.
    home.mkdir(parents=True, exist_ok=True)
    runtime = Path(tempfile.mkdtemp(prefix="bbrlab-lab-"))
    token, port = secrets.token_hex(24), free_port()
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={lab_root}", f"--IdentityProvider.token={token}",
            "--ServerApp.terminals_enabled=False", "--KernelManager.transport=ipc",
            "--LabApp.extension_manager=readonly"]  # lists the installed extensions, never asks PyPI
    if os.geteuid() == 0:
        argv.append("--allow-root")  # make test runs as root (the testbed needs it)
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=lab_environment(home, runtime), cwd=lab_root, start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", port, token, lab_root, log, proc, Processes())

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode} before answering:\n{server.log_tail()}")
        try:
            return server.api("GET", "/api/status", timeout_s=2)
        except (OSError, urllib.error.URLError):
            return None

    try:
        wait_for(ready, f"JupyterLab's API on port {port}", SERVER_START_S, poll_s=0.2)
        yield server
    finally:
        stop_lab(server)
        shutil.rmtree(runtime, ignore_errors=True)
        left = server.processes.stop_leftovers()
        assert not left, f"JupyterLab left processes behind: {left}"


# -- the browser -----------------------------------------------------------------------------------------

@dataclass
class Browser:
    driver: object  # selenium.webdriver.Chrome
    driver_pid: int
    processes: Processes


@contextmanager
def opened_browser(profile: Path) -> Iterator[Browser]:
    """Debian's chromium, headless, through Debian's chromedriver (both by path: Selenium Manager never looks
    for or downloads one), with its profile in ``profile``; quit, and checked to leave no process, at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        assert os.access(path, os.X_OK), f"{path} is missing: `make setup` installs Debian's {package}"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={profile}",
                "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root inside its sandbox
    # The driver named by its path: Selenium Manager is never asked to find, or download, one.
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    session = Browser(driver, service.process.pid, Processes())
    try:
        session.processes.note(session.driver_pid)
        yield session
    finally:
        session.processes.note(session.driver_pid)
        driver.quit()  # ends chromium, then chromedriver
        left = session.processes.stop_leftovers()
        assert not left, f"the browser left processes behind: {left}"


# -- reading and driving JupyterLab's page -------------------------------------------------------------------

def read_page(driver, selector: str, attribute: str = "textContent") -> list[str]:
    """``attribute`` of every element matching ``selector``, read in one go: the page changes while a kernel
    runs, and an element found by one WebDriver call may be gone by the next. textContent is read even
    where the browser skips drawing (cells out of view)."""
    return driver.execute_script("return Array.from(document.querySelectorAll(arguments[0]),"
                                 " e => e.getAttribute(arguments[1]) ?? e[arguments[1]] ?? '')", selector, attribute)


def kernel_status(driver) -> str | None:
    found = read_page(driver, f"{SHOWN} .jp-Notebook-ExecutionIndicator", "data-status")
    return found[0] if found else None


def kernel_name(driver) -> str:
    found = read_page(driver, f"{SHOWN} .jp-Toolbar-kernelName")
    return found[0].strip() if found else ""


def wait_idle(driver, what: str, deadline_s: float) -> None:
    wait_for(lambda: kernel_status(driver) == "idle", what, deadline_s, poll_s=0.2)


def input_prompts(driver) -> list[str]:
    return [p.strip() for p in read_page(driver, f"{SHOWN} .jp-CodeCell .jp-InputArea-prompt")]


def error_outputs(driver) -> list[str]:
    """The checker: what the page shows as an error. Output areas, the cells' and the widgets' (the picker's
    figure is one), that render an error, a stderr stream or a renderer's failure, and widgets that could
    not be displayed."""
    shown = [t.strip() for t in read_page(driver, STDERR_OUTPUT)]
    return shown + [t.strip() for t in read_page(driver, ".jp-OutputArea-output") if "Error displaying widget" in t]


def click_menu(driver, menu: str, command: str) -> None:
    """Click ``menu`` in the menu bar, then its item for ``command``, as a person does."""
    from selenium.webdriver.common.by import By

    bar = [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if e.text.strip() == menu]
    assert bar, f"no {menu!r} menu in JupyterLab's menu bar"
    bar[0].click()
    item = wait_for(lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{command}"]')
                             if e.is_displayed()], f"the {command} item of the {menu} menu", 10)
    item[0].click()


def open_notebook(lab: Lab, driver, notebook: str) -> None:
    """Open ``notebook`` (its path from the server's root) in a fresh workspace and wait until all its cells
    show, its kernel (the "bbrlab (.venv)" one it names) is up and idle."""
    driver.get(f"{lab.url}/lab/tree/{notebook}?reset&token={lab.token}")
    cells = len(json.loads((lab.root / notebook).read_text())["cells"])
    wait_for(lambda: len(read_page(driver, f"{SHOWN} .jp-Notebook .jp-Cell")) == cells,
             f"JupyterLab to show the {cells} cells of {notebook}", SERVER_START_S, poll_s=0.2)
    sessions = wait_for(lambda: [s for s in lab.api("GET", "/api/sessions") if s["path"] == notebook],
                        f"a kernel for {notebook}", SERVER_START_S, poll_s=0.2)
    assert [s["kernel"]["name"] for s in sessions] == [KERNEL], sessions  # the kernel the notebook names
    wait_for(lambda: kernel_name(driver) == KERNEL_DISPLAY_NAME, f"the toolbar to show {KERNEL_DISPLAY_NAME!r}",
             SERVER_START_S, poll_s=0.2)
    wait_idle(driver, f"the kernel of {notebook} to start", SERVER_START_S)


def start_all(driver) -> None:
    """Run all cells from the Run menu, as a person does, and wait until the first one is queued."""
    click_menu(driver, "Run", "runmenu:run-all")
    wait_for(lambda: input_prompts(driver)[0] != "[ ]:", "the first cell to be queued", 30, poll_s=0.1)


def wait_all_ran(driver, what: str, deadline_s: float = NOTEBOOK_RUN_S) -> list[str]:
    """Wait until no cell is running or queued and the kernel is idle; returns the cells' prompts."""
    wait_for(lambda: "[*]:" not in input_prompts(driver) and kernel_status(driver) == "idle", what, deadline_s,
             poll_s=0.5)
    return input_prompts(driver)


def shut_kernels(lab: Lab, notebook: str) -> None:
    """Shut down the kernels of ``notebook`` (the server and the browser serve the next test)."""
    try:
        for session in lab.api("GET", "/api/sessions"):
            if session["path"] == notebook:
                lab.api("DELETE", f"/api/sessions/{session['id']}")
    except (OSError, urllib.error.URLError):
        pass  # a server that is gone has no kernels left; its processes are checked when it stops
