"""Token ids as text (storage/token_text.py), with tokenizers built in the test, and where a
prefix group's first tokens are shown: GET /resets/{id}/prefixes and `kvscope report`, each
with `--tokenizer`, KVSCOPE_TOKENIZER or the config file's `[display] tokenizer`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.cli import app
from kvscope.storage.engine import open_store
from kvscope.storage.token_text import TokenizerError, TokenText
from tests.test_report import _store
from tests.token_support import trained_tokenizer, word_tokenizer, words


def test_ids_decode_and_an_id_outside_the_vocabulary_shows_as_its_number(tmp_path: Path) -> None:
    text = TokenText(trained_tokenizer(tmp_path / "tokenizer.json"))
    vocab = {"you": 8, "are": 3, "a": 1, "helpful": 6}
    assert text.known(8) and not text.known(9) and not text.known(31_999)
    assert text.text([vocab["you"], vocab["are"], vocab["a"]]) == "you are a"
    assert text.text([8, 31_999, 3]) == "you [#31999] are"
    assert text.text([31_999, 9]) == "[#31999] [#9]"
    assert text.text([0, 6]) == "[UNK] helpful"  # special tokens are shown: they were cached
    assert text.text([]) == ""


def test_a_missing_or_broken_tokenizer_is_refused_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="nowhere.json"):
        TokenText(tmp_path / "nowhere.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": 1}')
    with pytest.raises(TokenizerError, match="not a tokenizer.json"):
        TokenText(broken)


def test_the_api_gives_each_groups_first_tokens_as_text_when_named(tmp_path: Path) -> None:
    store = _store(tmp_path)
    engine = open_store(store)
    plain = TestClient(create_app(ApiData(engine=engine))).get("/resets/1/prefixes").json()
    assert plain["items"] and all(g["first_text"] is None for g in plain["items"])
    settings = ApiSettings(token_text=TokenText(word_tokenizer(tmp_path / "tokenizer.json")))
    named = TestClient(create_app(ApiData(engine=engine), settings))
    answer = named.get("/resets/1/prefixes").json()
    assert [g["first_tokens"] for g in answer["items"]] == [
        g["first_tokens"] for g in plain["items"]
    ]
    for group in answer["items"]:
        assert group["first_text"] == words(group["first_tokens"])


def test_report_shows_first_tokens_as_text_by_flag_env_or_config(tmp_path: Path) -> None:
    store = _store(tmp_path)
    tokenizer = word_tokenizer(tmp_path / "tokenizer.json")
    engine = open_store(store)
    with TestClient(create_app(ApiData(engine=engine))) as client:
        first = [g["first_tokens"] for g in client.get("/resets/1/prefixes").json()["items"]]
    expected = words(first[0])
    config = tmp_path / "kvscope.toml"
    config.write_text(f'[display]\ntokenizer = "{tokenizer}"\n')
    runner = CliRunner()
    base = ["report", "--store", store, "--reset", "1"]
    ways = {
        "flag": (["--tokenizer", str(tokenizer)], {}),
        "env": ([], {"KVSCOPE_TOKENIZER": str(tokenizer)}),
        "config": (["--config", str(config)], {}),
    }
    for way, (extra, env) in ways.items():
        out = tmp_path / way
        result = runner.invoke(app, [*base, "--out", str(out), *extra], env=env)
        assert result.exit_code == 0, result.output
        assert expected in (out / "report.html").read_text(), way
    out = tmp_path / "ids"
    result = runner.invoke(app, [*base, "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert expected not in page and " ".join(map(str, first[0])) in page
    bad = runner.invoke(app, [*base, "--out", str(out), "--tokenizer", str(tmp_path / "no.json")])
    assert bad.exit_code == 2 and "no.json" in bad.output


def test_chromium_shows_the_first_tokens_as_text_in_the_tooltips(tmp_path: Path) -> None:
    """The page's prefix picture in headless Chromium, served with a tokenizer."""
    from tests.test_page import Dom, chromium, fill_store, serving

    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    fill_store(store)
    settings = ApiSettings(token_text=TokenText(word_tokenizer(tmp_path / "tokenizer.json")))
    with serving(create_app(ApiData(engine=open_store(store)), settings)) as url:
        prefixes = TestClient(create_app(ApiData(engine=open_store(store)), settings))
        items = prefixes.get("/resets/1/prefixes?limit=500").json()["items"]
        dumped = chromium(tmp_path, "--dump-dom", url + "/#reset=1")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = Dom()
    dom.feed(dumped.stdout)
    chart = dom.text_by_id["prefix-chart"]
    assert items and all(f"first tokens: {g['first_text']}" in chart for g in items)
    assert all(words(g["first_tokens"]) == g["first_text"] for g in items)
