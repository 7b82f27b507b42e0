"""JupyterLab as a person meets it, driven by a real headless browser (issue #31).

A JupyterLab server from the environment the tests run in (``sys.executable``'s venv) listens on
127.0.0.1, on a free port, behind a token, with its root in a temporary folder holding a copy of
``notebooks/`` and of ``data/`` (the notebooks read ``../data``; ``data.load`` writes its cache there,
so the repository's own folder is never touched). Its kernels talk over IPC sockets, not TCP. Debian's
chromium, headless, driven by Debian's chromedriver through Selenium (both named by path: Selenium
Manager never looks for, or downloads, a browser or a driver), opens ``notebooks/socket_state.ipynb``,
which starts the "bbrlab (.venv)" kernel that ``make setup`` registers, runs all cells from the Run
menu and waits until every cell has run and the kernel is idle. Then it picks two runs in the run
picker (``explore.pick_runs``) as a person does, a click then a Ctrl-click, and checks that the figure
under the picker changed after each and that no output area in the page, a cell's or a widget's, shows
an error. It saves a screenshot in ``build/screenshots/`` and prints its path; with
``BBRLAB_SCREENSHOT_DIR`` set, it copies it there as ``jupyterlab.png`` (how the README's
``docs/figures/jupyterlab.png`` is made).

The checker can fail: a copy of the notebook ends with a cell that makes the picker's figure callback
raise, and the same steps and the same checker find the traceback in the page.

Everything started here is stopped on every way out (the kernels, the server, chromedriver and
chromium), and the tests assert that none of their processes is left, and that none of them listens
on anything but the loopback interface.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bbrlab.analysis import explore, timeline
from tests.jupyterlab import (
    KERNEL,
    KERNEL_DISPLAY_NAME,
    Browser,
    Lab,
    Listener,
    error_outputs,
    listeners,
    open_notebook,
    opened_browser,
    read_page,
    shut_kernels,
    start_all,
    started_lab,
    wait_all_ran,
    wait_idle,
)
from tests.polling import wait_for

pytestmark = pytest.mark.system

ROOT = Path(__file__).parents[2]
#: The notebooks, as paths from the server's root (a notebook finds its data in ../data).
NOTEBOOK = "notebooks/socket_state.ipynb"
#: The copy of NOTEBOOK whose last cell breaks the picker's figure callback (the checker must see it), in a
#: folder of its own: the file browser in the screenshot shows the real notebooks only.
CALLBACK_RAISES_NOTEBOOK = "broken-on-purpose/socket_state_callback_raises.ipynb"
CALLBACK_RAISES_MESSAGE = "the picker's figure callback raises on purpose"
#: Where the screenshots go: build/ is the checkout's output folder, ignored by git (pytest's temporary
#: folders are pruned by the next sessions).
SCREENSHOTS = ROOT / "build" / "screenshots"
#: When set, the screenshot of the working notebook is copied there too, as jupyterlab.png.
SCREENSHOT_DIR_ENV = "BBRLAB_SCREENSHOT_DIR"

#: The timeline notebook, whose zoom widget (timeline.zoom_widget) moves its window.
TIMELINE_NOTEBOOK = "notebooks/timeline.ipynb"
#: The zoom widget's parts, by the CSS classes it gives them.
ZOOM = {part: f".{css_class}" for part, css_class in timeline.ZOOM_CSS.items()}

#: The run picker's parts, by the CSS classes explore.pick_runs gives them.
PICKER = {part: f".{css_class}" for part, css_class in explore.CSS_CLASSES.items()}

REDRAW_S = 120


# -- this test's server, browser and notebooks -------------------------------------------------------------

def notebook_whose_callback_raises(source: Path) -> dict:
    """``source`` with a last cell that makes the picker's figure callback raise.

    The notebook's ``draw`` looks ``plots.socket_state`` up each time it runs, so replacing it after the
    picker is shown breaks every later redraw, the ones a pick triggers, and nothing before."""
    nb = json.loads(source.read_text())
    code = (f"# Added by {Path(__file__).name}: from here on, every redraw of the run picker raises.\n"
            "def socket_state_that_raises(*args, **kwargs):\n"
            f"    raise RuntimeError({CALLBACK_RAISES_MESSAGE!r})\n\n\n"
            "plots.socket_state = socket_state_that_raises\n")
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "callback-raises", "metadata": {},
                        "outputs": [], "source": code.splitlines(keepends=True)})
    return nb


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    """The server's root: the notebooks (and the broken copy) next to a copy of data/ (without its caches)."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns("__*", ".*"))
    shutil.copytree(ROOT / "data", root / "data", ignore=shutil.ignore_patterns("tables"))
    broken = root / CALLBACK_RAISES_NOTEBOOK
    broken.parent.mkdir()
    broken.write_text(json.dumps(notebook_whose_callback_raises(root / NOTEBOOK), indent=1))
    return root


@pytest.fixture(scope="module")
def lab(lab_root, tmp_path_factory):
    with started_lab(lab_root, tmp_path_factory.mktemp("jupyter-home")) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with opened_browser(tmp_path_factory.mktemp("chromium-profile")) as session:
        yield session


def figure_image(driver) -> str | None:
    """The picker's figure as the page holds it (the PNG's data URL), or None while there is none."""
    images = read_page(driver, f"{PICKER['figure']} img", "src")
    return images[0] if len(images) == 1 else None


def two_runs_to_compare(labels: list[str]) -> tuple[int, int]:
    """Which two of the runs labelled ``labels`` to pick: two variants under the same timeslice, share and
    RTT, the most contended such pair (the figure then tells something), else the first two."""
    parts = [label.replace("\xa0", " ").split(" | ") for label in labels]  # the list shows spaces as &nbsp;

    def share(i: int) -> float:
        found = re.search(r"([\d.]+) %", " ".join(parts[i]))
        return float(found.group(1)) if found else 100.0

    pairs = [(i, j) for i in range(len(parts)) for j in range(i + 1, len(parts))
             if parts[i][0] != parts[j][0] and parts[i][1:4] == parts[j][1:4]]
    return min(pairs, key=lambda pair: share(pair[0])) if pairs else (0, 1)


def wait_redrawn(driver, before: str | None) -> str | None:
    """Wait until the picker's figure differs from ``before`` (or the page shows an error instead), then until
    the kernel is idle; returns the figure then shown (None when there is none)."""

    def redrawn() -> bool:
        now = figure_image(driver)
        return (now is not None and now != before) or bool(error_outputs(driver))

    wait_for(redrawn, "the figure to be redrawn after a pick", REDRAW_S, poll_s=0.2)
    wait_idle(driver, "the kernel after a pick", REDRAW_S)
    return figure_image(driver)


@dataclass
class Visit:
    """What the browser saw of one notebook, run and picked in."""

    notebook: str
    figures: list[str | None]  # the picker's figure: first, after the click, after the Ctrl-click
    picked: list[str]
    errors: list[str]
    screenshot: Path
    listeners: list[Listener]
    seconds: dict[str, float]


def run_and_pick(lab: Lab, browser: Browser, notebook: str, screenshot: Path) -> Visit:
    """Open ``notebook`` (its path from the server's root), run all cells, pick two runs; a screenshot is saved, even on failure.
    The notebook's kernel is shut down afterwards (the server and the browser serve the next test)."""
    driver = browser.driver
    try:
        return _run_and_pick(lab, browser, notebook, screenshot)
    except Exception as e:
        try:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
            e.add_note(f"screenshot: {screenshot}; errors in the page: {error_outputs(driver)}")
        except Exception as unseen:  # the browser may be what failed
            e.add_note(f"no screenshot: {unseen!r}")
        e.add_note(f"JupyterLab's log ends with:\n{lab.log_tail()}")
        raise
    finally:
        shut_kernels(lab, notebook)
        driver.get("about:blank")


def _run_and_pick(lab: Lab, browser: Browser, notebook: str, screenshot: Path) -> Visit:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, seconds, t0 = browser.driver, {}, time.monotonic()

    def lap(step: str) -> None:
        seconds[step] = round(time.monotonic() - t0 - sum(seconds.values()), 1)

    open_notebook(lab, driver, notebook)
    lap("open")

    start_all(driver)
    prompts = wait_all_ran(driver, f"every cell of {notebook} to run")
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), f"not every cell ran: {prompts}"
    lap("run all")

    box = driver.find_element(By.CSS_SELECTOR, PICKER["box"])
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", box)
    figures = [wait_for(lambda: figure_image(driver), "the picker's first figure", REDRAW_S)]
    offered = driver.find_elements(By.CSS_SELECTOR, f"{PICKER['runs']} select option:not(:checked)")
    assert len(offered) >= 2, "the picker offers fewer than two other runs"
    first, second = (offered[i] for i in two_runs_to_compare([o.get_attribute("textContent") for o in offered]))
    for option in (first, second):  # into the list's view (it shows `rows` of them), as a person scrolls it
        driver.execute_script("arguments[0].scrollIntoView({block: 'nearest'})", option)
    ActionChains(driver).click(first).perform()  # a click picks one run instead of the one shown at first
    figures.append(wait_redrawn(driver, figures[-1]))
    ActionChains(driver).key_down(Keys.CONTROL).click(second).key_up(Keys.CONTROL).perform()  # adds one
    figures.append(wait_redrawn(driver, figures[-1]))
    picked = [t.replace("\xa0", " ") for t in read_page(driver, f"{PICKER['runs']} select option:checked")]
    lap("pick")

    driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", box)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(screenshot))
    pids = lab.processes.note(lab.proc.pid) | browser.processes.note(browser.driver_pid)
    return Visit(notebook, figures, picked, error_outputs(driver), screenshot, listeners(pids), seconds)


def report(visit: Visit, record_property) -> None:
    record_property("screenshot", str(visit.screenshot))
    sockets = ", ".join(sorted({f"{s.proto} [{s.address}]:{s.port}" for s in visit.listeners}))
    print(f"\n{visit.notebook} in JupyterLab: screenshot {visit.screenshot}; seconds {visit.seconds}; "
          f"listening: {sockets}")


# -- the tests ---------------------------------------------------------------------------------------------

def test_socket_state_notebook_runs_and_redraws_on_a_pick_in_jupyterlab(lab, browser, record_property):
    spec = lab.api("GET", "/api/kernelspecs")["kernelspecs"].get(KERNEL)
    assert spec, f"no {KERNEL!r} kernel in {sys.prefix}: `make setup` registers it"
    assert spec["spec"]["display_name"] == KERNEL_DISPLAY_NAME
    assert Path(spec["spec"]["argv"][0]).parent == Path(sys.executable).parent  # this environment's python

    visit = run_and_pick(lab, browser, NOTEBOOK, SCREENSHOTS / "jupyterlab.png")
    report(visit, record_property)
    if os.environ.get(SCREENSHOT_DIR_ENV):
        Path(os.environ[SCREENSHOT_DIR_ENV]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(visit.screenshot, Path(os.environ[SCREENSHOT_DIR_ENV]) / "jupyterlab.png")

    assert not visit.errors, f"the page shows errors (screenshot {visit.screenshot}):\n" + "\n\n".join(visit.errors)
    assert len(visit.picked) == 2, visit.picked
    assert None not in visit.figures and len(set(visit.figures)) == 3, "the figure did not change on each pick"
    assert any(s.port == lab.port for s in visit.listeners), "the server's own socket was not found"
    assert [s for s in visit.listeners if not s.loopback] == [], "listening beyond the loopback interface"


def test_the_checker_sees_a_widget_callback_that_raises(lab, browser, record_property):
    visit = run_and_pick(lab, browser, CALLBACK_RAISES_NOTEBOOK, SCREENSHOTS / "jupyterlab-callback-raises.png")
    report(visit, record_property)
    assert visit.figures[0] is not None  # the figure was drawn before the pick: the pick's callback raised
    assert any(CALLBACK_RAISES_MESSAGE in e and "RuntimeError" in e for e in visit.errors), visit.errors


def zoom_state(driver) -> tuple[str | None, list[str]]:
    """The zoom widget's figure (its PNG's data URL) and its sliders' readouts (start [s], length [ms])."""
    images = read_page(driver, f"{ZOOM['figure']} img", "src")
    readouts = [t.strip() for t in read_page(driver, f"{ZOOM['start']} .widget-readout, {ZOOM['length']} .widget-readout")]
    return (images[0] if len(images) == 1 else None), readouts


def test_timeline_notebook_zooms_in_jupyterlab(lab, browser, record_property):
    """Run notebooks/timeline.ipynb over data/ (the traced demo), then move its zoom window with the widget's
    buttons and its length slider's keys, as a person does: each step redraws the figure for the new window, and
    going back redraws the first figure again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, screenshot = browser.driver, SCREENSHOTS / "jupyterlab-timeline.png"
    try:
        open_notebook(lab, driver, TIMELINE_NOTEBOOK)
        start_all(driver)
        prompts = wait_all_ran(driver, f"every cell of {TIMELINE_NOTEBOOK} to run")
        assert all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), f"not every cell ran: {prompts}"
        box = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ZOOM["box"]), "the zoom widget", REDRAW_S)[0]
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", box)
        first = wait_for(lambda: zoom_state(driver)[0] and zoom_state(driver), "the zoom's first figure", REDRAW_S)
        assert first[1] == ["0.20", "450"], first[1]  # the notebook's parameters: 0.2 s, 0.45 s

        def step(action, want: list[str]) -> str:
            before = zoom_state(driver)[0]
            action()
            wait_for(lambda: (zoom_state(driver)[0] not in (None, before) and zoom_state(driver)[1] == want)
                     or bool(error_outputs(driver)), f"the zoom to redraw for {want}", REDRAW_S, poll_s=0.2)
            wait_idle(driver, "the kernel after a zoom", REDRAW_S)
            assert not error_outputs(driver), error_outputs(driver)
            return zoom_state(driver)[0]

        later = step(lambda: driver.find_element(By.CSS_SELECTOR, f"{ZOOM['later']}").click(), ["0.65", "450"])
        handle = driver.find_element(By.CSS_SELECTOR, f"{ZOOM['length']} .noUi-handle")
        longer = step(lambda: handle.send_keys(Keys.ARROW_RIGHT), ["0.65", "460"])
        step(lambda: handle.send_keys(Keys.ARROW_LEFT), ["0.65", "450"])
        back = step(lambda: driver.find_element(By.CSS_SELECTOR, f"{ZOOM['earlier']}").click(), ["0.20", "450"])
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", box)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))
    except Exception as e:
        driver.save_screenshot(str(screenshot))
        e.add_note(f"screenshot: {screenshot}; errors in the page: {error_outputs(driver)}")
        raise
    finally:
        shut_kernels(lab, TIMELINE_NOTEBOOK)
        driver.get("about:blank")
    record_property("screenshot", str(screenshot))
    assert len({first[0], later, longer}) == 3, "the figure did not change with the window"
    assert back == first[0], "back at the first window, the figure is not the first one"
