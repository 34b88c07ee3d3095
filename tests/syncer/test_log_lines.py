"""The text log line: time, level, message, the record's extras, then a traceback; redacted as a whole."""

from __future__ import annotations

import logging
import re

import pytest
from loguru import logger

from syncer.logs import MASK, setup_logging


def test_a_text_line_shows_time_level_message_and_extras_verbatim(capfd: pytest.CaptureFixture[str]) -> None:
    try:
        setup_logging("INFO", "text")
        logger.bind(component="clusters").info("cluster {} is up {{literal}} <red>", "c0001")
        logger.bind(manager="m/c0002", token="planted").warning("started controller {}", "probe")
        logger.info("no extras")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.bind(component="x").exception("failed")
        logging.getLogger("some.library").warning("from %s", "the standard library")
        lines = capfd.readouterr().err.splitlines()
    finally:
        setup_logging()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "
    assert re.fullmatch(stamp + r"INFO    cluster c0001 is up \{literal\} <red>  \[component=clusters\]", lines[0])
    assert re.fullmatch(stamp + rf"WARNING started controller probe  \[manager=m/c0002 token={MASK}\]", lines[1])
    assert re.fullmatch(stamp + "INFO    no extras", lines[2])
    assert re.fullmatch(stamp + r"ERROR   failed  \[component=x\]", lines[3])
    assert lines[4] == "Traceback (most recent call last):" and lines[-2] == "ValueError: boom"
    assert re.fullmatch(stamp + "WARNING from the standard library", lines[-1])


def test_an_exceptions_locals_are_not_rendered(capfd: pytest.CaptureFixture[str]) -> None:
    # The sink writes the traceback itself; loguru must not also render every frame's locals (its "diagnose").
    rendered: list[str] = []

    class Local:
        ok = True

        def __repr__(self) -> str:
            rendered.append("repr")
            return "Local()"

    def fail() -> None:
        local = Local()
        raise ValueError("boom" if local.ok else "")  # "diagnose" shows the values of the names on this line

    try:
        setup_logging("INFO", "text")
        try:
            fail()
        except ValueError:
            logger.exception("failed")
        assert "ValueError: boom" in capfd.readouterr().err
    finally:
        setup_logging()
    assert rendered == []
