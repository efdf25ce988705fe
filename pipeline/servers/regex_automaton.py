"""Regex full matches in time linear in the text, with a bounded cost per pattern: the
answers of simpipe's own servers (the stub and the emulator) match a request's regex
without a backtracking engine, so a pattern such as ``([^Z]|[^Z])*Z`` costs what any other
pattern costs instead of freezing the server (Python's ``re`` backtracks: 2**n steps there).

How: Python's own regex parser (``re._parser``, so the syntax and its errors are exactly
``re``'s) gives the pattern's tree; it becomes a Thompson NFA, and ``fullmatch`` walks the
text once through a DFA built lazily from it (a DFA state is the set of NFA states the text
so far can be in; each transition is computed once and cached). Two budgets bound the work
an attacker can make a server do: ``MAX_STATES`` NFA states (counted repeats are expanded:
``(a{100}){100}`` is 10,000 states) and ``MAX_WORK`` NFA state visits spent building DFA
transitions over the automaton's life. Past either, ``RegexTooComplex``. The cost of one
pattern is therefore bounded (about 0.1 s of CPU), and what was built is reused by the
next request with the same pattern.

What the servers' constrained decoders do not accept either (outlines in TGI, xgrammar in
vLLM: regular languages only) is refused with ``RegexError``: back-references, look-around,
``\\b``/``\\B``, atomic groups, possessive repeats, conditionals, multi-line anchors.
"""

from __future__ import annotations

import re
import re._constants as sre  # the parser's own opcodes (Python >= 3.11)
import re._parser as sre_parse
from collections import OrderedDict
from collections.abc import Callable

MAX_PATTERN_CHARS = 20_000
MAX_STATES = 10_000
MAX_WORK = 200_000

_CHAR, _SPLIT, _ASSERT, _MATCH = range(4)
_START, _END, _END_OR_FINAL_NEWLINE = range(3)  # what an anchor asks of the position
_MIDDLE = (False, False, False)  # (at start, at end, before a final newline)

_ASCII_SPACE = frozenset(" \t\n\r\f\v")


class RegexError(ValueError):
    """The pattern is not a regex this module can match; the message says why."""


class RegexTooComplex(RegexError):
    """The pattern needs more states or work than the budgets allow."""


def _category(name: object, ascii_only: bool) -> Callable[[str], bool]:
    digit = (lambda c: "0" <= c <= "9") if ascii_only else str.isdecimal
    space = _ASCII_SPACE.__contains__ if ascii_only else str.isspace

    def word(c: str) -> bool:
        return c == "_" or ((c.isascii() or not ascii_only) and c.isalnum())

    table: dict[object, Callable[[str], bool]] = {
        sre.CATEGORY_DIGIT: digit,
        sre.CATEGORY_NOT_DIGIT: lambda c: not digit(c),
        sre.CATEGORY_SPACE: space,
        sre.CATEGORY_NOT_SPACE: lambda c: not space(c),
        sre.CATEGORY_WORD: word,
        sre.CATEGORY_NOT_WORD: lambda c: not word(c),
        sre.CATEGORY_LINEBREAK: lambda c: c == "\n",
        sre.CATEGORY_NOT_LINEBREAK: lambda c: c != "\n",
    }
    if name not in table:
        raise RegexError(f"unsupported character class {name}")
    return table[name]


def _variants(c: str, ignore_case: bool) -> tuple[str, ...]:
    return (c, c.lower(), c.upper(), c.casefold()) if ignore_case else (c,)


def _set_predicate(items: list, flags: int) -> Callable[[str], bool]:
    """A ``[...]`` class as a predicate."""
    ignore_case = bool(flags & re.IGNORECASE)
    ascii_only = bool(flags & re.ASCII)
    negate = False
    chars: set[str] = set()
    ranges: list[tuple[int, int]] = []
    tests: list[Callable[[str], bool]] = []
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            chars.add(chr(av))
        elif op is sre.RANGE:
            ranges.append(av)
        elif op is sre.CATEGORY:
            tests.append(_category(av, ascii_only))
        else:
            raise RegexError(f"unsupported item {op} in a character class")

    def member(c: str) -> bool:
        for v in _variants(c, ignore_case):
            if v in chars or any(lo <= ord(v) <= hi for lo, hi in ranges if len(v) == 1):
                return True
        return any(t(c) for t in tests)

    return (lambda c: not member(c)) if negate else member


class _Builder:
    """The NFA of a parsed pattern, built back to front (each piece knows what follows)."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.arg: list = []  # CHAR: predicate; ASSERT: condition
        self.out: list = []  # CHAR, ASSERT: next state; SPLIT: list of next states

    def state(self, kind: int, arg: object, out: object) -> int:
        if len(self.kind) >= MAX_STATES:
            raise RegexTooComplex(f"more than {MAX_STATES} automaton states")
        self.kind.append(kind)
        self.arg.append(arg)
        self.out.append(out)
        return len(self.kind) - 1

    def seq(self, items: list, flags: int, nxt: int) -> int:
        for item in reversed(items):
            nxt = self.node(item, flags, nxt)
        return nxt

    def node(self, item: tuple, flags: int, nxt: int) -> int:
        op, av = item
        ignore_case = bool(flags & re.IGNORECASE)
        if op is sre.LITERAL:
            if not ignore_case:
                literal = chr(av)
                return self.state(_CHAR, lambda c: c == literal, nxt)
            same = frozenset(_variants(chr(av), True))
            return self.state(_CHAR, lambda c: any(v in same for v in _variants(c, True)), nxt)
        if op is sre.NOT_LITERAL:
            other = frozenset(_variants(chr(av), ignore_case))
            return self.state(_CHAR, lambda c: all(v not in other
                                                   for v in _variants(c, ignore_case)), nxt)
        if op is sre.ANY:
            pred = (lambda c: True) if flags & re.DOTALL else (lambda c: c != "\n")
            return self.state(_CHAR, pred, nxt)
        if op is sre.IN:
            return self.state(_CHAR, _set_predicate(av, flags), nxt)
        if op is sre.BRANCH:
            return self.state(_SPLIT, None, [self.seq(alt, flags, nxt) for alt in av[1]])
        if op is sre.SUBPATTERN:
            _, add, remove, sub = av
            return self.seq(sub, (flags | add) & ~remove, nxt)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # greedy or lazy: the same language
            return self.repeat(av, flags, nxt)
        if op is sre.AT:
            return self.anchor(av, flags, nxt)
        names = {sre.GROUPREF: "back-references", sre.GROUPREF_EXISTS: "conditional groups",
                 sre.ASSERT: "look-around", sre.ASSERT_NOT: "look-around",
                 sre.ATOMIC_GROUP: "atomic groups", sre.POSSESSIVE_REPEAT: "possessive repeats"}
        raise RegexError(f"{names.get(op, str(op))} are not supported (regular expressions "
                         "only, as constrained decoders accept)")

    def repeat(self, av: tuple, flags: int, nxt: int) -> int:
        low, high, sub = av
        if high == sre.MAXREPEAT:
            loop = self.state(_SPLIT, None, [])
            self.out[loop] += [self.seq(sub, flags, loop), nxt]
            tail = loop
        else:  # up to high - low optional copies, each of which may end the repeat
            tail = nxt
            for _ in range(high - low):
                tail = self.state(_SPLIT, None, [self.seq(sub, flags, tail), nxt])
        for _ in range(low):
            tail = self.seq(sub, flags, tail)
        return tail

    def anchor(self, at: object, flags: int, nxt: int) -> int:
        if at in (sre.AT_BEGINNING, sre.AT_END) and flags & re.MULTILINE:
            raise RegexError("line anchors (re.MULTILINE) are not supported")
        conditions = {sre.AT_BEGINNING: _START, sre.AT_BEGINNING_STRING: _START,
                      sre.AT_END: _END_OR_FINAL_NEWLINE, sre.AT_END_STRING: _END}
        if at not in conditions:
            raise RegexError("word boundaries (\\b, \\B) are not supported")
        return self.state(_ASSERT, conditions[at], nxt)


class Automaton:
    """One pattern, matched with ``fullmatch(text)`` in one pass over ``text``."""

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_PATTERN_CHARS:
            raise RegexTooComplex(f"pattern longer than {MAX_PATTERN_CHARS} characters")
        try:
            parsed = sre_parse.parse(pattern)
        except re.error as exc:
            raise RegexError(str(exc)) from None
        except RecursionError:  # groups nested thousands deep
            raise RegexTooComplex("groups nested too deeply") from None
        b = _Builder()
        final = b.state(_MATCH, None, None)
        try:
            start = b.seq(parsed.data, parsed.state.flags, final)
        except RecursionError:
            raise RegexTooComplex("groups nested too deeply") from None
        self._kind, self._arg, self._out = b.kind, b.arg, b.out
        self.work = 0  # NFA state visits spent so far (MAX_WORK at most)
        # The lazily built DFA. A DFA state is a set of NFA states (``core``: where the
        # text so far can be, before moves without input), known by its number; -1 is the
        # empty set, where no text matches. Everything cached here was paid for with work,
        # so the budget bounds its size too.
        self._ids: dict[frozenset, int] = {}
        self._cores: list[frozenset] = []
        self._rows: list[dict[str, int]] = []  # transitions away from any anchor
        self._anchored: dict[tuple, int] = {}  # transitions where an anchor may hold
        self._closures: dict[tuple, tuple[tuple[int, ...], bool]] = {}
        self._answers: dict[str, bool] = {}  # whole short texts: the servers repeat them
        self._start = self._id(frozenset((start,)))

    @property
    def states(self) -> int:
        return len(self._kind)

    def _spend(self, n: int) -> None:
        self.work += n
        if self.work > MAX_WORK:
            raise RegexTooComplex(f"matching needs more than {MAX_WORK} automaton steps")

    def _id(self, core: frozenset) -> int:
        if not core:
            return -1
        found = self._ids.get(core)
        if found is None:
            found = self._ids[core] = len(self._cores)
            self._cores.append(core)
            self._rows.append({})
        return found

    def _closure(self, state: int, ctx: tuple[bool, bool, bool]
                 ) -> tuple[tuple[int, ...], bool]:
        """The character-consuming NFA states reachable from DFA state ``state`` without
        input, and whether the match state is, at a position described by ``ctx``."""
        cached = self._closures.get((state, ctx))
        if cached is not None:
            return cached
        kind, arg, out = self._kind, self._arg, self._out
        at_start, at_end, final_newline = ctx
        seen: set[int] = set()
        stack = list(self._cores[state])
        chars: list[int] = []
        accept = False
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = kind[s]
            if k == _CHAR:
                chars.append(s)
            elif k == _SPLIT:
                stack.extend(out[s])
            elif k == _ASSERT:
                cond = arg[s]
                if (at_start if cond == _START else at_end if cond == _END
                        else at_end or final_newline):
                    stack.append(out[s])
            else:
                accept = True
        self._spend(len(seen) + 1)
        result = self._closures[(state, ctx)] = (tuple(sorted(chars)), accept)
        return result

    def _step(self, state: int, ch: str, ctx: tuple[bool, bool, bool]) -> int:
        chars, _ = self._closure(state, ctx)
        self._spend(len(chars) + 1)
        arg, out = self._arg, self._out
        return self._id(frozenset(out[s] for s in chars if arg[s](ch)))

    def _anchored_step(self, state: int, ch: str, ctx: tuple[bool, bool, bool]) -> int:
        key = (state, ch, ctx)
        found = self._anchored.get(key)
        if found is None:
            found = self._anchored[key] = self._step(state, ch, ctx)
        return found

    def fullmatch(self, text: str) -> bool:
        """Whether the whole of ``text`` matches (``re.fullmatch``); ``RegexTooComplex`` if
        the budget runs out on the way."""
        answer = self._answers.get(text)
        if answer is None:
            answer = self._match(text)
            if len(text) <= 4096 and len(self._answers) < 1024:
                self._answers[text] = answer
        return answer

    def _match(self, text: str) -> bool:
        n = len(text)
        if n == 0:
            return self._closure(self._start, (True, True, False))[1]
        # Anchors can only hold at the first position, the end, and before a final newline
        # (``$``): those steps have their own cache; the others are one dict lookup each.
        end = n - 1 if n > 1 and text[-1] == "\n" else n
        state = self._anchored_step(self._start, text[0], (True, False, text == "\n"))
        rows = self._rows
        for i in range(1, end):
            if state < 0:
                return False
            ch = text[i]
            nxt = rows[state].get(ch)
            if nxt is None:
                nxt = rows[state][ch] = self._step(state, ch, _MIDDLE)
            state = nxt
        if end < n and state >= 0:
            state = self._anchored_step(state, "\n", (False, False, True))
        return state >= 0 and self._closure(state, (False, True, False))[1]


_cache: OrderedDict[str, Automaton] = OrderedDict()
CACHE_SIZE = 8  # simpipe sends one or two patterns per run


def compile_regex(pattern: str) -> Automaton:
    """The automaton of ``pattern``, from a small cache (servers see the same few patterns
    again and again); ``RegexError`` / ``RegexTooComplex`` for a pattern it cannot take."""
    automaton = _cache.get(pattern)
    if automaton is not None:
        _cache.move_to_end(pattern)
        return automaton
    automaton = Automaton(pattern)
    _cache[pattern] = automaton
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return automaton


def forget(pattern: str) -> None:
    """Drop ``pattern``'s automaton (it ran out of budget: a later request starts afresh)."""
    _cache.pop(pattern, None)
