"""The HPACK decoder: RFC 7541's examples, its error rules, and the same answers as ``hpack.Decoder`` (the decoder
it replaces) on random blocks, valid and corrupted, over whole connections (the dynamic table carried along)."""

from __future__ import annotations

import random
import uuid

import hpack
import hpack.huffman
import hpack.huffman_constants
import pytest
from hpack.huffman_table import decode_huffman

from informers.hpack_decoder import _HUFFMAN, Decoder, _huffman

_CODER = hpack.huffman.HuffmanEncoder(hpack.huffman_constants.REQUEST_CODES,
                                      hpack.huffman_constants.REQUEST_CODES_LENGTH)


def test_rfc_7541_c4_requests_with_huffman_coding_share_one_dynamic_table() -> None:
    d = Decoder()
    assert d.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")) == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")]
    assert d.decode(bytes.fromhex("828684be5886a8eb10649cbf")) == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
        (b"cache-control", b"no-cache")]
    assert d.decode(bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")) == [
        (b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
        (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")]


@pytest.mark.parametrize("encoded, why", [
    (bytes.fromhex("ff"), "8 bits of padding"),
    (bytes.fromhex("00"), "padding that is not 1 bits"),  # "0" (00000), then 000
    (bytes.fromhex("ffffffff"), "EOS"),
])
def test_invalid_huffman_strings_are_refused_as_hpack_refuses_them(encoded: bytes, why: str) -> None:
    with pytest.raises(hpack.HPACKDecodingError):
        decode_huffman(encoded)
    with pytest.raises(hpack.HPACKDecodingError):
        _huffman(encoded)


def test_a_table_size_update_must_come_first_and_stay_within_what_was_allowed() -> None:
    d = Decoder()
    with pytest.raises(hpack.HPACKDecodingError):
        d.decode(bytes.fromhex("82" "3f e1 1f".replace(" ", "")))  # after a field
    d = Decoder()
    d.max_allowed_table_size = 100
    with pytest.raises(hpack.InvalidTableSizeError):
        d.decode(bytes.fromhex("3f e1 1f".replace(" ", "") + "82"))  # 4096 > 100
    d = Decoder()
    d.max_allowed_table_size = 100
    assert d.decode(bytes.fromhex("3f 45 82".replace(" ", ""))) == [(b":method", b"GET")]  # 100


def test_an_oversized_header_list_is_refused() -> None:
    d = Decoder()
    d.max_header_list_size = 100
    block = hpack.Encoder().encode([(b"x-big", b"v" * 100)])
    with pytest.raises(hpack.OversizedHeaderListError):
        d.decode(block)


def _text(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.3:
        return str(uuid.UUID(int=rng.getrandbits(128))).encode()
    if roll < 0.6:
        return bytes(rng.choice(b"abcdefxyz-0123456789 ,:;/.ABCDEFGMT") for _ in range(rng.randrange(40)))
    return bytes(rng.randrange(256) for _ in range(rng.randrange(30)))


def _outcome(decoder: hpack.Decoder | Decoder, block: bytes) -> object:
    try:
        return [tuple(field) for field in decoder.decode(block, raw=True)]
    except hpack.HPACKDecodingError:
        return "refused"


def test_huffman_decoding_agrees_with_hpack_on_valid_and_random_strings() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        text = _text(rng)
        assert _huffman(_CODER.encode(text)) == text
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
        expected: object
        try:
            expected = decode_huffman(junk)
        except hpack.HPACKDecodingError:
            expected = "refused"
        try:
            got: object = _huffman(junk)
        except hpack.HPACKDecodingError:
            got = "refused"
        assert got == expected, junk.hex()


def test_connections_of_random_blocks_decode_as_hpack_decodes_them() -> None:
    rng = random.Random(11)
    for _ in range(600):
        encoder = hpack.Encoder()
        if rng.random() < 0.3:
            encoder.header_table_size = rng.choice([0, 64, 256, 1024, 4096])
        ours, theirs = Decoder(), hpack.Decoder()
        ours.max_allowed_table_size = theirs.max_allowed_table_size = rng.choice([4096, 4096, 1024, 0])
        for _ in range(rng.randrange(1, 12)):
            fields: list[tuple[bytes, bytes]] = [(_text(rng) or b"x", _text(rng)) for _ in range(rng.randrange(8))]
            fields += [(b":status", b"200"), (b"content-type", b"application/json")]
            rng.shuffle(fields)
            block = encoder.encode([hpack.NeverIndexedHeaderTuple(*f) if rng.random() < 0.1 else f for f in fields],
                                   huffman=rng.random() < 0.8)
            if rng.random() < 0.05 and block:  # a corrupted byte
                at = rng.randrange(len(block))
                block = block[:at] + bytes([rng.randrange(256)]) + block[at + 1:]
            if rng.random() < 0.03:  # cut short
                block = block[:rng.randrange(len(block) + 1)]
            expected = _outcome(theirs, block)
            assert _outcome(ours, block) == expected, block.hex()
            if expected == "refused":
                break  # h2 ends the connection at its first decoding error
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        assert _outcome(Decoder(), junk) == _outcome(hpack.Decoder(), junk), junk.hex()


def test_only_short_strings_are_kept_for_other_connections() -> None:
    short, long = _CODER.encode(b"application/json"), _CODER.encode(b"x" * 200)
    for text in (short, long):
        _HUFFMAN.decode(text)
    assert short in _HUFFMAN and long not in _HUFFMAN
    assert len(long) > _HUFFMAN.LONGEST and _HUFFMAN.decode(long) == b"x" * 200
