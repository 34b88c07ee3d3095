"""Logging: loguru for our logs and, intercepted, for the standard-library logs of dependencies.

No credential may reach a log line, whoever wrote it. Two rules keep it so:

- The libraries that see requests on the wire (``WIRE_LIBRARIES``: the HTTP/2 and HPACK codecs, the HTTP clients,
  the kubernetes package) stay at WARNING whatever ``log_level`` says; only the ``log_libraries`` setting lowers
  one, by name. hpack's DEBUG lines carry every header block sent, the Authorization field included.
- Every line is redacted as it is written (``redact``), the message, its extras and any traceback alike:
  Authorization, Proxy-Authorization and Cookie values, bearer and basic credentials, PEM blocks (and their
  base64 form, as a kubeconfig's ``*-data`` fields hold them) and ``token``/``password``-like fields are masked.
  A binary argument of a wire library's record (an encoded header block, a frame) is shown as its length only:
  Huffman-coded text is no less readable than plain text to anyone who decodes it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import traceback
from typing import Any, Iterator, Mapping

import orjson
from loguru import logger

# Loggers (and their children) held at WARNING unless ``log_libraries`` names them.
WIRE_LIBRARIES = ("hpack", "h2", "hyperframe", "aiohttp", "urllib3", "requests", "requests_oauthlib", "oauthlib",
                  "kubernetes", "websocket", "httpx", "httpcore")
_STDLIB_LEVELS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "SUCCESS": 25, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
MASK = "<redacted>"

# A header name and its separator, as the libraries print it: ``Authorization: x``, ``'authorization': 'x'``,
# ``b'authorization'=b'x'``, ``"cookie":"x"``; the value runs to its closing quote or the end of the line.
_HEADER = re.compile(
    r"""(?P<key>\b(?:proxy-)?authorization|\b(?:set-)?cookie)(?P<sep>\\?['"]?\s*[:=,]\s*(?:(?-i:b)(?=['"]))?)"""
    r"""(?:(?P<q>\\?['"])(?:(?!(?P=q))(?:\\.|.))*(?P=q)?|[^\r\n,;}\]]+)""", re.IGNORECASE)
_SCHEME = re.compile(r"\b(?P<key>[Bb]earer|Basic|BEARER|BASIC)(?P<sep>\s+)[A-Za-z0-9\-._~+/=:]{6,}")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.DOTALL)
_PEM_BASE64 = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/=\\n]*")  # base64 of "-----BEGIN"
# A field named like a credential (``token``, ``x-api-token``, ``client-key-data``): the name's own prefix is kept as
# written, so the match starts at the keyword (a prefix before it would be re-scanned for every keyword tried).
_FIELD_NAME = r"token|password|passwd|secret|client[-_]key[-_]data|client[-_]certificate[-_]data"
_FIELD_SEP = r"""\\?['"]?\s*[:=]"""
_FIELD = re.compile(
    rf"""(?P<key>{_FIELD_NAME})(?P<sep>{_FIELD_SEP}\s*(?:(?-i:b)(?=['"]))?)"""
    r"""(?:(?P<q>\\?['"])(?:(?!(?P=q))(?:\\.|.))*(?P=q)|[^\s,;}\]'"]+)""",
    re.IGNORECASE)
_FIELD_IN_LOWER_ASCII = re.compile(f"(?:{_FIELD_NAME}){_FIELD_SEP}")  # redact's prefilter: the same name and separator


def _masked(match: re.Match[str]) -> str:
    quote = match.groupdict().get("q") or ""
    return f"{match['key']}{match['sep']}{quote}{MASK}{quote}"


def redact(text: str) -> str:
    """``text`` with every credential-looking value replaced by ``MASK``."""
    if not text:
        return text
    text = _PEM.sub(MASK, text)
    text = _PEM_BASE64.sub(MASK, text)
    # The patterns below ignore case and are slow to scan a line with. An ASCII line whose lower case lacks one's
    # keywords (a field: its name and separator) cannot match it, and a mask put in adds none: most lines skip
    # them. Other text is scanned whole, where re's case folding decides.
    low = text.lower() if text.isascii() else None
    if low is None or "authorization" in low or "cookie" in low:
        text = _HEADER.sub(_masked, text)
    if low is None or "bearer" in low or "basic" in low:
        text = _SCHEME.sub(lambda m: f"{m['key']}{m['sep']}{MASK}", text)
    if low is None or _FIELD_IN_LOWER_ASCII.search(low):
        text = _FIELD.sub(_masked, text)
    return text


def _wire(name: str) -> bool:
    return any(name == lib or name.startswith(lib + ".") for lib in WIRE_LIBRARIES)


def _shown(arg: Any) -> Any:
    """A wire library's argument as it may be shown: bytes only when they are short printable text."""
    if isinstance(arg, (bytes, bytearray, memoryview)):
        data = bytes(arg)
        if len(data) > 256 or not all(32 <= b < 127 for b in data):
            return f"<{len(data)} bytes>"
    return arg


class _Intercept(logging.Handler):
    """Forward standard-library records to loguru, keeping the caller's location."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        if record.args and _wire(record.name):
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(_shown(a) for a in args)
        message = record.getMessage()
        logger.bind(logger_name=record.name).opt(depth=6, exception=record.exc_info).log(level, message)


def _json_sink(message: Any) -> None:
    r = message.record
    line = {"time": r["time"].isoformat(), "level": r["level"].name, "message": r["message"],
            "logger": r["extra"].get("logger_name", r["name"])}
    line.update((k, str(v)) for k, v in r["extra"].items() if k != "logger_name")
    if r["exception"] is not None:
        line["exception"] = "".join(traceback.format_exception(*r["exception"]))
    sys.stderr.write(redact(orjson.dumps(line).decode()) + "\n")


def _text_sink(message: Any) -> None:
    # The line is made here, not by a loguru format: a format naming each record's extras is a new template per
    # member and controller, which loguru parses anew each time (a third of a log line's cost).
    r = message.record
    t = r["time"]
    line = (f"{t.year:04d}-{t.month:02d}-{t.day:02d} {t.hour:02d}:{t.minute:02d}:{t.second:02d}."
            f"{t.microsecond // 1000:03d} {r['level'].name: <7} {r['message']}")
    extras = " ".join(f"{k}={v}" for k, v in r["extra"].items() if k != "logger_name")
    if extras:
        line += f"  [{extras}]"
    line += "\n"
    if r["exception"] is not None:
        line += "".join(traceback.format_exception(*r["exception"]))
    sys.stderr.write(redact(line))


def setup_logging(level: str = "INFO", fmt: str = "text", libraries: Mapping[str, str] | None = None) -> None:
    """Configure loguru (text or JSON lines on stderr) and route standard-library logging through it.

    ``level`` is a loguru level name in any case (``debug``, ``INFO``); ``libraries`` maps standard-library
    logger names to their own levels (the only way to lower one of ``WIRE_LIBRARIES`` below WARNING).
    """
    level = level.upper()
    levels = {name: _STDLIB_LEVELS[lib_level.upper()] for name, lib_level in (libraries or {}).items()}
    ours = _STDLIB_LEVELS.get(level, logging.INFO)
    # The sink takes the lowest level asked for; our own records (not intercepted) are held to ``level``.
    floor = min([ours, *levels.values()])

    def ours_at_level(record: Any) -> bool:
        return "logger_name" in record["extra"] or record["level"].no >= ours

    logger.remove()
    if fmt == "json":
        logger.add(_json_sink, level=floor, filter=ours_at_level)
    else:
        logger.add(_text_sink, level=floor, filter=ours_at_level, colorize=False, backtrace=False, diagnose=False,
                   format="{message}")
    logging.basicConfig(handlers=[_Intercept()], level=ours, force=True)
    for name in WIRE_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, library_level in levels.items():
        logging.getLogger(name).setLevel(library_level)


@contextlib.contextmanager
def logs_after(level: str = "INFO", fmt: str = "text",
               libraries: Mapping[str, str] | None = None) -> Iterator[None]:
    """Configure logging as ``setup_logging`` does, but hold back what the block logs until it ends: a command
    whose output is a document (``check-config``) shows its warnings after it, not in the middle of it."""
    held: list[Any] = []
    logger.remove()
    logger.add(held.append, level=level.upper(), format="{message}")
    try:
        yield
    finally:
        setup_logging(level, fmt, libraries)
        for message in held:
            record = message.record
            logger.patch(_as_at(record)).opt(exception=record["exception"]).log(record["level"].name,
                                                                                record["message"])


def _as_at(held: Any) -> Any:
    """A loguru patcher that gives a replayed record the place and extras of the ``held`` one."""
    def patch(record: Any) -> None:
        record.update(name=held["name"], function=held["function"], line=held["line"], extra=held["extra"])
    return patch
