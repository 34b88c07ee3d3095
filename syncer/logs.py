"""Logging: loguru for our logs and, intercepted, for the standard-library logs of dependencies."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from typing import Any, Iterator

import orjson
from loguru import logger

# Libraries that log request details (possibly credentials) at DEBUG: never below INFO.
_QUIET = ("kubernetes", "urllib3", "aiohttp.client")
_STDLIB_LEVELS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "SUCCESS": 25, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


class _Intercept(logging.Handler):
    """Forward standard-library records to loguru, keeping the caller's location."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.bind(logger_name=record.name).opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def _json_sink(message: Any) -> None:
    r = message.record
    line = {"time": r["time"].isoformat(), "level": r["level"].name, "message": r["message"],
            "logger": r["extra"].get("logger_name", r["name"])}
    line.update((k, str(v)) for k, v in r["extra"].items() if k != "logger_name")
    if r["exception"] is not None:
        line["exception"] = "".join(traceback.format_exception(*r["exception"]))
    sys.stderr.write(orjson.dumps(line).decode() + "\n")


def _text_format(record: Any) -> str:
    extras = " ".join(f"{k}={v}" for k, v in record["extra"].items() if k != "logger_name")
    extras = extras.replace("{", "{{").replace("}", "}}").replace("<", r"\<")
    return "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {message}" + (f"  [{extras}]" if extras else "") + \
        "\n{exception}"


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure loguru (text or JSON lines on stderr) and route standard-library logging through it.

    ``level`` is a loguru level name in any case (``debug``, ``INFO``).
    """
    level = level.upper()
    logger.remove()
    if fmt == "json":
        logger.add(_json_sink, level=level)
    else:
        logger.add(sys.stderr, level=level, colorize=False, backtrace=False, diagnose=False, format=_text_format)
    logging.basicConfig(handlers=[_Intercept()], level=_STDLIB_LEVELS.get(level, logging.INFO), force=True)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger().level))


@contextlib.contextmanager
def logs_after(level: str = "INFO", fmt: str = "text") -> Iterator[None]:
    """Configure logging as ``setup_logging`` does, but hold back what the block logs until it ends: a command
    whose output is a document (``check-config``) shows its warnings after it, not in the middle of it."""
    held: list[Any] = []
    logger.remove()
    logger.add(held.append, level=level.upper(), format="{message}")
    try:
        yield
    finally:
        setup_logging(level, fmt)
        for message in held:
            record = message.record
            logger.patch(_as_at(record)).opt(exception=record["exception"]).log(record["level"].name,
                                                                                record["message"])


def _as_at(held: Any) -> Any:
    """A loguru patcher that gives a replayed record the place and extras of the ``held`` one."""
    def patch(record: Any) -> None:
        record.update(name=held["name"], function=held["function"], line=held["line"], extra=held["extra"])
    return patch
