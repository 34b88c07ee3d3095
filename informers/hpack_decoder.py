"""An HPACK decoder (RFC 7541) for the header blocks of an API server's responses, in place of ``hpack.Decoder``.

It keeps ``hpack.Decoder``'s interface as h2 uses it (``decode(block, raw=True)``, ``max_header_list_size``,
``max_allowed_table_size``) and raises ``hpack``'s exceptions, which h2 turns into a connection error. The
difference is cost: every response of an API server carries fields no table holds (a new ``audit-id``, often a
new ``date``), which ``hpack.Decoder`` Huffman-decodes a nibble at a time and logs field by field, ~50 µs a
response, ~150 µs for a new connection's first one (the priority-and-fairness names and uids): a sixth of the
client's CPU for a small request. Here a symbol is found with one lookup of the next 8 bits (the codes of
letters, digits and the punctuation of dates and uids are at most 8 bits long; longer ones are looked up by
length), and the decodings of recurring strings are kept for every connection of the process (``_HUFFMAN``):
field names, content types, uids.
"""

from __future__ import annotations

from collections import deque

import hpack
import hpack.huffman_constants
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC = HeaderTable.STATIC_TABLE
_EOS = 256
_ENTRY_OVERHEAD = 32  # RFC 7541 §4.1


def _short_codes() -> tuple[tuple[tuple[int, int], ...], dict[tuple[int, int], int]]:
    """The Huffman code as two tables: for each value of the next 8 bits, the symbol whose code of at most 8 bits
    they start with and its length (0: the code is longer); and the longer codes by (length, code)."""
    short = [(0, 0)] * 256
    long: dict[tuple[int, int], int] = {}
    codes, lengths = hpack.huffman_constants.REQUEST_CODES, hpack.huffman_constants.REQUEST_CODES_LENGTH
    for symbol, (code, length) in enumerate(zip(codes, lengths)):
        if length <= 8:
            first = code << (8 - length)
            short[first:first + (1 << (8 - length))] = [(symbol, length)] * (1 << (8 - length))
        else:
            long[(length, code)] = symbol
    return tuple(short), long


_SHORT, _LONG = _short_codes()
_LONGEST = max(hpack.huffman_constants.REQUEST_CODES_LENGTH)


class _Decodings(dict[bytes, bytes]):
    """Huffman-coded strings of up to ``LONGEST`` bytes and their decodings, for every connection of the process;
    emptied when full (well under 1 MiB: a server's long or unique values cannot make it grow further)."""

    LIMIT = 1024
    LONGEST = 96  # a uid, a date, a content type; not a server's long values

    def decode(self, data: bytes) -> bytes:
        if len(data) > self.LONGEST:
            return decode_huffman(data)  # linear in the length; ``_huffman`` shifts one int of all of it per symbol
        decoded = self.get(data)
        if decoded is None:
            if len(self) >= self.LIMIT:
                self.clear()
            decoded = self[data] = _huffman(data)
        return decoded


def _huffman(data: bytes) -> bytes:
    """``data`` (a short string: the cost grows with the square of its length) Huffman-decoded; HPACKDecodingError
    for an invalid code, EOS, or padding that is not 1 bits or is longer than 7 (RFC 7541 §5.2)."""
    bits = int.from_bytes(data, "big")
    left = len(data) * 8
    out = bytearray()
    short, long = _SHORT, _LONG
    while left:
        if left < 8:
            tail = (1 << left) - 1
            if bits & tail == tail:
                break  # the padding: the start of EOS
            window = ((bits << (8 - left)) | ((1 << (8 - left)) - 1)) & 0xFF
        else:
            window = (bits >> (left - 8)) & 0xFF
        symbol, length = short[window]
        if length and length <= left:
            out.append(symbol)
            left -= length
            continue
        for length in range(9, min(left, _LONGEST) + 1):
            symbol = long.get((length, (bits >> (left - length)) & ((1 << length) - 1)), -1)
            if symbol >= 0:
                break
        else:
            raise hpack.HPACKDecodingError("Invalid Huffman string")
        if symbol == _EOS:
            raise hpack.HPACKDecodingError("Huffman string contains EOS")
        out.append(symbol)
        left -= length
    return bytes(out)


_HUFFMAN = _Decodings()


def _integer(data: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """The integer with a ``prefix``-bit prefix at ``pos`` (RFC 7541 §5.1), and the position after it."""
    mask = (1 << prefix) - 1
    try:
        value = data[pos] & mask
        pos += 1
        if value < mask:
            return value, pos
        shift = 0
        while True:
            byte = data[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, pos
            shift += 7
            if shift > 28:  # no header block needs an integer of more than 4 continuation bytes
                raise hpack.HPACKDecodingError("Integer too large")
    except IndexError:
        raise hpack.HPACKDecodingError("Truncated header block") from None


class Decoder:
    """One connection's HPACK decoding context: its dynamic table, bounded by what the peer may use."""

    def __init__(self) -> None:
        self.max_header_list_size = 2 ** 16
        self.max_allowed_table_size = 4096  # SETTINGS_HEADER_TABLE_SIZE as acknowledged; h2 keeps it current
        self._table: deque[tuple[bytes, bytes]] = deque()  # newest first
        self._size = 0
        self._max = 4096

    def decode(self, data: bytes, raw: bool = True) -> list[tuple[bytes, bytes]]:
        """The block's fields as ``(name, value)`` byte pairs (``raw`` must be True: h2 decodes nothing else)."""
        if not raw:
            raise ValueError("only raw decoding is supported")
        fields: list[tuple[bytes, bytes]] = []
        listed = 0
        pos, end = 0, len(data)
        while pos < end:
            first = data[pos]
            if first & 0x80:
                field = self._indexed(*_integer(data, pos, 7))
                pos = field[2]
            elif first & 0x40:
                field = self._literal(data, pos, 6)
                pos = field[2]
                self._add(field[0], field[1])
            elif first & 0x20:
                if fields:
                    raise hpack.HPACKDecodingError("Table size update not at the start of the block")
                size, pos = _integer(data, pos, 5)
                if size > self.max_allowed_table_size:
                    raise hpack.InvalidTableSizeError("Encoder exceeded max allowable table size")
                self._max = size
                self._evict()
                continue
            else:  # without indexing (0000) or never indexed (0001)
                field = self._literal(data, pos, 4)
                pos = field[2]
            name, value = field[0], field[1]
            fields.append((name, value))
            listed += len(name) + len(value) + _ENTRY_OVERHEAD
            if listed > self.max_header_list_size:
                raise hpack.OversizedHeaderListError(
                    f"A header list larger than {self.max_header_list_size} has been received")
        if self._max > self.max_allowed_table_size:
            raise hpack.InvalidTableSizeError("Encoder did not shrink table size to within the max")
        return fields

    def _indexed(self, index: int, pos: int) -> tuple[bytes, bytes, int]:
        if 0 < index <= len(_STATIC):
            name, value = _STATIC[index - 1]
        elif 0 < index - len(_STATIC) <= len(self._table):
            name, value = self._table[index - len(_STATIC) - 1]
        else:
            raise hpack.InvalidTableIndexError(f"Invalid table index {index}")
        return name, value, pos

    def _literal(self, data: bytes, pos: int, prefix: int) -> tuple[bytes, bytes, int]:
        index, pos = _integer(data, pos, prefix)
        if index:
            name = self._indexed(index, pos)[0]
        else:
            name, pos = self._string(data, pos)
        value, pos = self._string(data, pos)
        return name, value, pos

    @staticmethod
    def _string(data: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(data):
            raise hpack.HPACKDecodingError("Truncated header block")
        huffman = data[pos] & 0x80
        length, pos = _integer(data, pos, 7)
        if pos + length > len(data):
            raise hpack.HPACKDecodingError("Truncated header block")
        raw = data[pos:pos + length]
        return (_HUFFMAN.decode(raw) if huffman and raw else raw), pos + length

    def _add(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + _ENTRY_OVERHEAD
        if size > self._max:
            self._table.clear()  # RFC 7541 §4.4: an entry larger than the table empties it
            self._size = 0
            return
        self._table.appendleft((name, value))
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD
