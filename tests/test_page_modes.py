"""The page's modes side by side (api/page_modes.py) in headless Chromium, over a real
`kvscope demo --source lab` run (tests/mode_compare_support.py) served by a real uvicorn: every
figure shown, for each replica, is the one `GET /resets/compare` answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from tests.mode_compare_support import REPLICAS
from tests.test_page import Dom, chromium, serving, with_page

PERCENT = ("share_back_10s", "hit_rate_before", "hit_rate_after")
SECONDS = ("t50_s", "t90_s")
MILLIS = ("ttft_p50_before", "ttft_p50_after")


class ModesDom(Dom):
    """Also each modes cell: (its row's data-figure, its data-mode) -> (data-value, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], tuple[str, str]] = {}
        self._figure: str | None = None
        self._cell: tuple[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        super().handle_starttag(tag, attrs)
        a = {k: v or "" for k, v in attrs}
        if tag == "tr":
            self._figure = a.get("data-figure")
        elif tag == "td" and self._figure is not None and "data-mode" in a:
            self._cell = (self._figure, a["data-mode"])
            self.cells[self._cell] = (a["data-value"], "")

    def handle_endtag(self, tag: str) -> None:
        super().handle_endtag(tag)
        if tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        super().handle_data(data)
        if self._cell is not None:
            value, text = self.cells[self._cell]
            self.cells[self._cell] = (value, text + data)


@pytest.fixture(scope="module")
def served(
    lab_demo_store: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("page-modes")
    with serving(with_page(create_app(ApiData(engine=lab_demo_store)))) as url:
        yield url, folder


def _shown_matches(key: str, text: str, value: float | None) -> bool:
    """The page's formatting of `value`, read back: counts exact, seconds to 0.1 s below 10 s,
    shares to 0.1 %, TTFT to the millisecond."""
    if value is None:
        return text == "\u2013"
    if key in PERCENT:
        return text.endswith(" %") and abs(float(text[:-2]) - 100 * value) <= 0.05 + 1e-9
    if key in SECONDS:
        step = 0.05 if value < 10 else 0.5
        return text.endswith(" s") and abs(float(text[:-2]) - value) <= step + 1e-9
    if key in MILLIS:
        return text.endswith(" ms") and int(text[:-3]) == round(1000 * value)
    return float(text.replace(",", "")) == pytest.approx(value, abs=5e-4)


@pytest.mark.parametrize("replica", REPLICAS)
def test_chromium_shows_the_apis_modes_side_by_side(served: tuple[str, Path], replica: str) -> None:
    url, folder = served
    compared = httpx.get(url + "/resets/compare", params={"replica": replica}, timeout=60).json()
    assert [m["mode"] for m in compared["modes"]] == ["default", "preempt", "keep"]
    mine = [r for r in httpx.get(url + "/resets", timeout=60).json() if r["replica"] == replica]
    assert mine

    dumped = chromium(folder, "--dump-dom", url + f"/#reset={mine[0]['id']}")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = ModesDom()
    dom.feed(dumped.stdout)
    assert dom.text_by_id["modes-title"] == f"Modes side by side on {replica}"
    heads = [a["data-mode"] for a in dom.find("th") if "data-mode" in a]
    assert heads == ["default", "preempt", "keep"]
    cells = dom.cells  # (figure, mode) -> (data-value, text)
    for m in compared["modes"]:
        value, text = cells[("refused", m["mode"])]
        assert (int(value), text) == (m["refused"], f"{m['refused']}/{m['resets']}")
        for key, expected in m["medians"].items():
            value, text = cells[(key, m["mode"])]
            assert (value == "null") if expected is None else float(value) == expected
            assert _shown_matches(key, text, expected), (key, m["mode"], text, expected)
    # The lab refuses the default reset: its column is refused and has no figure.
    assert cells[("refused", "default")][1] == "1/1"
    assert cells[("preempted", "default")][1] == "\u2013"
    assert float(cells[("preempted", "preempt")][0]) > 0
    assert len(cells) == 11 * 3
    assert dom.text_by_id["modes-note"].startswith(f"{len(compared['resets'])} reset requests")
