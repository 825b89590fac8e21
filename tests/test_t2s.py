"""OpenCC's t2s is skipped only for texts it cannot change.

simdb.text.t2s reads, from OpenCC's own dictionaries, the characters at which the conversion can change a
text; a text with none of them is not converted. A wrong set would silently change fingerprints, so the set
is checked against the converter itself: every character outside it, alone; the dictionaries' phrases with
their changing characters taken out, and random strings of the characters those phrases share with
ordinary text; every devset text the set lets pass.
"""

from __future__ import annotations

import random

import pytest

from simdb.text import normalize, t2s

changing = t2s.changing_characters()
needs_set = pytest.mark.skipif(changing is None, reason="OpenCC's dictionaries cannot be read here")


def test_the_set_is_read_here():
    """The opencc wheel ships the tool that reads its dictionaries: where the tests run, the skip is on."""
    assert changing is not None and len(changing) > 3000
    assert {"學", "後", "來", "網", "設", "頭", "髮"} <= changing
    # 么 and 干 are values of traditional keys, and keys whose first value is themselves
    assert changing.isdisjoint("的了是什么人民日报北京中文干燥")


@needs_set
def test_every_character_outside_the_set_stays_itself():
    kept = 0
    for cp in range(0x10000):
        character = chr(cp)
        if 0xD800 <= cp <= 0xDFFF or character in changing:
            continue
        assert t2s.convert(character) == character, f"U+{cp:04X}"
        kept += 1
    assert kept > 55000


@needs_set
def test_every_key_that_changes_is_caught():
    keys = t2s.dictionary_entries()
    assert len(keys) > 5000
    for key, value in keys:
        if key != value:
            assert t2s.may_change(key), key
        if t2s.convert(key) != key:
            assert t2s.may_change(key), key


@needs_set
def test_phrases_without_their_changing_characters_stay_themselves():
    """The phrase entries are where matching spans characters: a phrase key matched with its changing
    characters taken out, or any mix of the characters the keys hold that lie outside the set, must come
    out unchanged, whichever keys the converter's longest-match picks."""
    keys = [key for key, _ in t2s.dictionary_entries() if len(key) > 1]
    inert = sorted({c for key in keys for c in key if c not in changing})
    assert len(inert) > 300
    for key in keys:
        rest = "".join(c for c in key if c not in changing)
        assert t2s.convert(rest) == rest, key
    rng = random.Random(20261124)
    for _ in range(3000):
        text = "".join(rng.choices(inert, k=rng.randint(2, 40)))
        assert t2s.convert(text) == text
    for _ in range(3000):  # the keys themselves, run together, with their changing characters out
        text = "".join(rng.choices(keys, k=rng.randint(1, 6)))
        text = "".join(c for c in text if c not in changing)
        assert t2s.convert(text) == text


@needs_set
def test_devset_texts_that_skip_the_converter_come_out_of_it_unchanged(devset_texts):
    skipped = 0
    for text in devset_texts:
        folded = normalize.fold(text)
        if not t2s.may_change(folded):
            assert t2s.convert(folded) == folded
            skipped += 1
        assert normalize.simplify(folded) == t2s.convert(folded)
    assert skipped > 0.75 * len(devset_texts)  # most real text skips it


def _cleared():
    t2s.changing_characters.cache_clear()
    t2s.marks.cache_clear()


def test_without_the_dictionaries_every_han_text_is_converted(monkeypatch):
    """Where the set cannot be read (no ``opencc_dict`` tool, an unknown dictionary type), nothing is
    skipped: the conversion is what it always was."""
    with monkeypatch.context() as m:
        m.setattr(t2s, "_tool", lambda: None)
        _cleared()
        try:
            assert t2s.changing_characters() is None and t2s.marks() is None
            assert t2s.may_change("abc")
            assert normalize.simplify("後來的頭髮") == "后来的头发"
            assert normalize.simplify("plain words") == "plain words"
        finally:
            _cleared()
    assert t2s.changing_characters() == changing


def test_an_unreadable_dictionary_turns_the_skip_off(monkeypatch):
    def broken(spec, directory, tool):
        raise ValueError(f"cannot read a dictionary of type 'zip' ({directory / spec['file']})")
        yield  # a generator, like the real one

    with monkeypatch.context() as m:
        m.setattr(t2s, "_entries", broken)
        _cleared()
        try:
            assert t2s.changing_characters() is None
        finally:
            _cleared()
    with monkeypatch.context() as m:  # a converter that names no configuration file (another opencc package)
        m.setattr(t2s, "converter", lambda: object())
        try:
            assert t2s.changing_characters() is None
        finally:
            _cleared()
    assert t2s.changing_characters() == changing


def test_the_marks_are_read_from_a_cache_file_that_matches_the_dictionaries(monkeypatch, tmp_path):
    """Issue 38: reading the dictionaries (``opencc_dict`` on each binary one) was 60 ms of every ``simdb
    fingerprint``. A later process reads the set from a cache file, without the dictionaries; one that does not
    hold a whole set is built again; another tool names another file."""
    expected = bytearray(t2s.BMP // 8)
    for character in changing:
        if ord(character) < t2s.BMP:
            expected[ord(character) >> 3] |= 1 << (ord(character) & 7)

    def unreadable():
        raise AssertionError("the dictionaries were read although the cache holds the set")

    with monkeypatch.context() as m:
        m.setenv("XDG_CACHE_HOME", str(tmp_path))
        _cleared()
        try:
            assert t2s.marks() == bytes(expected)
            [cached] = (tmp_path / "simdb").glob("t2s-marks-*.bin")
            assert cached.read_bytes() == bytes(expected)
            _cleared()
            m.setattr(t2s, "dictionary_entries", unreadable)
            assert t2s.marks() == bytes(expected)
            cached.write_bytes(b"\xff" * 100)  # cut short: built again (from the dictionaries)
            _cleared()
            m.undo()
            m.setenv("XDG_CACHE_HOME", str(tmp_path))
            assert t2s.marks() == bytes(expected) == cached.read_bytes()
            _cleared()
            m.setattr(t2s, "_tool", lambda: "/elsewhere/opencc_dict")
            assert t2s._marks_cache_path() != cached
        finally:
            _cleared()
