"""Bounded JSON: numbers as long as their type holds, and no value that loops forever.

A JSON grammar allows a number of any length and a string or array of any length; a small
model can fall into a loop (``12000000000…``, ``"hahaha…"``, ``[0,0,0,…]``) and run to
``max_tokens``, which leaves an answer that is cut (``finish_reason`` ``length``). So a
JSON-constrained sequence is followed by ``JsonLexer`` (where its output stands: in a
string, in a number and how many digits it has, how deep) and each sampled token is
checked before it is taken:

- a number may have at most ``MAX_INTEGER_DIGITS`` digits where the grammar allows no
  fraction (an integer field: what a 64-bit integer holds), else at most
  ``MAX_SIGNIFICANT_DIGITS`` significant digits (what a double holds) after at most
  ``MAX_LEADING_ZEROS`` zeros (``0.00000001``), and an exponent of at most
  ``MAX_EXPONENT_DIGITS`` digits;
- inside a container or a string (not a number: the digit bounds judge those), the same pattern of 1 to ``MAX_LOOP_PERIOD`` tokens may
  not repeat three times over ``MIN_LOOP_TOKENS`` tokens or more;
- an array may not hold the same string, object or array item ``MAX_REPEATED_ITEMS``
  times (``["Quebec","Ontario","Quebec",...]``; numbers and literals may repeat).

A token that breaks a rule is replaced by the first token of the grammar's greedy closing
path (the path ``max_tokens`` already uses): it ends the number, or closes the string or
container that loops, and the model goes on from there.

A schema narrows these bounds (``minimum`` / ``maximum``, kept by the grammar) but does
not widen them: they are what the client's 64-bit integer or double can hold, and
llguidance compiles no range beyond 64 bits anyway. A value that needs more digits is a
string (``"type": "string"`` with a ``pattern`` such as ``^[0-9]{1,40}$``). Strings and
arrays follow ``maxLength``, ``pattern`` and ``maxItems`` through the grammar itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

#: digits of an integer field: 64-bit integers have at most 19
MAX_INTEGER_DIGITS = 19
#: significant digits of a number field: a double round-trips through 17
MAX_SIGNIFICANT_DIGITS = 17
#: zeros before a number's first significant digit (0.000000001); smaller values take
#: the exponent
MAX_LEADING_ZEROS = 9
MAX_EXPONENT_DIGITS = 3
#: a loop: one pattern of 1..MAX_LOOP_PERIOD tokens repeated three times, over at least
#: MIN_LOOP_TOKENS tokens
MAX_LOOP_PERIOD = 16
MIN_LOOP_TOKENS = 24
#: the tokens a sequence keeps to find loops in
LOOP_TAIL = 3 * MAX_LOOP_PERIOD
#: an array may not hold the same string, object or array item this many times
MAX_REPEATED_ITEMS = 3
_DIGITS = frozenset(b"0123456789")


@dataclasses.dataclass
class _Number:
    """The number being written: its digits before the exponent, those that are
    significant, and the exponent's."""

    num_digits: int = 0
    num_significant: int = 0
    has_fraction: bool = False
    has_exponent: bool = False
    num_exponent_digits: int = 0
    needs_digit: bool = False  # after '-', '.', 'e' or 'e+': not a complete number yet

    def add(self, byte: int) -> bool:
        """Take ``byte``; False when it does not belong to a number (the number ended)."""
        if byte in _DIGITS:
            if self.has_exponent:
                self.num_exponent_digits += 1
            else:
                self.num_digits += 1
                if self.num_significant or byte != ord("0"):
                    self.num_significant += 1
            self.needs_digit = False
        elif byte == ord(".") and not self.has_fraction and not self.has_exponent:
            self.has_fraction = self.needs_digit = True
        elif byte in b"eE" and not self.has_exponent:
            self.has_exponent = self.needs_digit = True
        elif byte in b"+-" and (self.has_exponent and self.num_exponent_digits == 0
                                or not self.num_digits):
            self.needs_digit = True
        else:
            return False
        return True

    def too_long(self, integer_field: bool) -> bool:
        if self.num_exponent_digits > MAX_EXPONENT_DIGITS:
            return True
        if integer_field:
            return self.num_digits > MAX_INTEGER_DIGITS
        leading_zeros = self.num_digits - self.num_significant
        room = self.num_significant < MAX_SIGNIFICANT_DIGITS  # for the digit it needs
        return (self.num_significant > MAX_SIGNIFICANT_DIGITS or leading_zeros > MAX_LEADING_ZEROS
                or (self.needs_digit and not self.has_exponent and not room))


@dataclasses.dataclass
class _Array:
    """An open array: where its current item starts in the text, and how often each
    string, object or array item it holds has come."""

    item_start: int
    item_counts: dict[bytes, int] = dataclasses.field(default_factory=dict)


class JsonLexer:
    """Where a JSON text stands after the bytes fed so far (grammar-valid by construction,
    so only what the bounds need is tracked): the text, the open containers (arrays with
    their items), whether in a string, the number being written."""

    def __init__(self) -> None:
        self.text = bytearray()
        self.containers: list[_Array | None] = []  # None: an object
        self.in_string = False
        self.escaped = False
        self.number: _Number | None = None

    @property
    def depth(self) -> int:
        return len(self.containers)

    def feed(self, data: bytes) -> None:
        """Advance over ``data`` (the bytes of a token the grammar accepted)."""
        for byte in data:
            self._feed_byte(byte)

    def repeats_an_item(self, data: bytes) -> bool:
        """True if ``data`` would end an item of the innermost array that it already holds
        MAX_REPEATED_ITEMS - 1 times (a string, object or array item)."""
        array = self.containers[-1] if self.containers else None
        if array is None:
            return False
        in_string, escaped, depth = self.in_string, self.escaped, 0
        for i, byte in enumerate(data):
            if in_string:
                if escaped:
                    escaped = False
                elif byte == ord("\\"):
                    escaped = True
                elif byte == ord('"'):
                    in_string = False
            elif byte == ord('"'):
                in_string = True
            elif byte in b"{[":
                depth += 1
            elif byte in b"}]" and depth:
                depth -= 1
            elif depth == 0 and byte in b",]":
                item = (bytes(self.text[array.item_start:]) + data[:i]).strip()
                return _counts(item) and array.item_counts.get(item, 0) + 1 >= MAX_REPEATED_ITEMS
        return False

    def _feed_byte(self, byte: int) -> None:
        self.text.append(byte)
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif byte == ord("\\"):
                self.escaped = True
            elif byte == ord('"'):
                self.in_string = False
            return
        if self.number is not None:
            if self.number.add(byte):
                return
            self.number = None
        if byte == ord('"'):
            self.in_string = True
        elif byte in _DIGITS or byte == ord("-"):
            self.number = _Number()
            self.number.add(byte)
        elif byte == ord("{"):
            self.containers.append(None)
        elif byte == ord("["):
            self.containers.append(_Array(len(self.text)))
        elif byte in b",]" and self.containers and self.containers[-1] is not None:
            array = self.containers[-1]
            item = bytes(self.text[array.item_start:-1]).strip()
            if _counts(item):
                array.item_counts[item] = array.item_counts.get(item, 0) + 1
            array.item_start = len(self.text)
            if byte == ord("]"):
                self.containers.pop()
        elif byte in b"}]" and self.containers:
            self.containers.pop()


def _counts(item: bytes) -> bool:
    """Items whose repeats are a loop: strings, objects and arrays (numbers and literals
    repeat in real data)."""
    return bool(item) and item[:1] in (b'"', b"{", b"[")


def numbers_in(lexer: JsonLexer, data: bytes) -> list[_Number]:
    """Every number ``data`` would touch after ``lexer`` (its last state: bounds only grow),
    the lexer itself left as it is."""
    number = dataclasses.replace(lexer.number) if lexer.number is not None else None
    in_string, escaped = lexer.in_string, lexer.escaped
    seen: list[_Number] = []
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string = False
            continue
        if number is not None:
            if number.add(byte):
                continue
            seen.append(number)
            number = None
        if byte == ord('"'):
            in_string = True
        elif byte in _DIGITS or byte == ord("-"):
            number = _Number()
            number.add(byte)
    if number is not None:
        seen.append(number)
    return seen


def is_loop(tail: Sequence[int]) -> bool:
    """True when ``tail`` (token ids, the newest last) ends in one pattern of 1 to
    MAX_LOOP_PERIOD tokens repeated three times, over at least MIN_LOOP_TOKENS tokens."""
    tail = list(tail)
    for period in range(1, MAX_LOOP_PERIOD + 1):
        span = max(MIN_LOOP_TOKENS, 3 * period)
        if len(tail) < span:
            break
        window = tail[-span:]
        if all(window[i] == window[i - period] for i in range(period, span)):
            return True
    return False
