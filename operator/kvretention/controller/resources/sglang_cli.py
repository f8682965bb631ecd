"""SGLang's own server-argument parser, rebuilt without importing SGLang (its import needs torch).

``sglang_options.json`` is every option of the ``argparse`` parser that SGLang 0.5.23's
``ServerArgs.add_cli_args`` builds: option strings with their aliases, ``dest`` and ``nargs``,
generated from the real parser (``KVR_UPDATE_GOLDEN=1 pytest tests/unit/controller/
test_sglang_flags.py`` regenerates it; the same file checks it against SGLang's source). The parser
here has the same options and settings (``allow_abbrev`` on), so ``extraArgs`` is read exactly as
SGLang will read it: ``--model`` is ``--model-path`` and ``--tp-siz 4`` is ``--tp-size 4``.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, NoReturn

OPTIONS_FILE: Final = "sglang_options.json"


class SglangArgsError(ValueError):
    """SGLang's parser would refuse the arguments; the message is argparse's own."""


@dataclass(frozen=True)
class SetOption:
    """One option an argv sets: as written, and as SGLang's parser resolved it."""

    index: int
    """Position in the argv of the token naming the option."""
    written: str
    option: str
    """The option's first (canonical) spelling, e.g. ``--model-path`` for ``--model``."""
    dest: str


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SglangArgsError(message)


class _Record(argparse.Action):
    """Remembers which option set which setting (the value itself does not matter here)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.seen.append((option_string or self.option_strings[0], self))


@functools.cache
def option_table() -> dict[str, Any]:
    """The generated table: ``{"sglang", "allow_abbrev", "actions": [{options, dest, nargs}]}``."""
    text = resources.files(__package__).joinpath(OPTIONS_FILE).read_text()
    table: dict[str, Any] = json.loads(text)
    return table


@functools.cache
def _parser() -> _Parser:
    table = option_table()
    parser = _Parser(prog="sglang serve", add_help=False, allow_abbrev=bool(table["allow_abbrev"]))
    for action in table["actions"]:
        parser.add_argument(
            *action["options"], dest=action["dest"], nargs=action["nargs"], action=_Record
        )
    return parser


def sglang_version() -> str:
    return str(option_table()["sglang"])


def dest_of(flag: str) -> str | None:
    """The setting an exact option string names (``--tp-size`` -> ``tp_size``), if SGLang has it."""
    for action in option_table()["actions"]:
        if flag in action["options"]:
            return str(action["dest"])
    return None


def parse_sglang_args(argv: Sequence[str]) -> list[SetOption]:
    """The options ``argv`` sets, in order, resolved by SGLang's rules (aliases, abbreviations).

    Raises :class:`SglangArgsError` with argparse's message where SGLang would refuse ``argv``
    (an unknown or ambiguous option, a missing value, a stray positional).
    """
    namespace = argparse.Namespace(seen=[])
    _parser().parse_args(list(argv), namespace)
    out: list[SetOption] = []
    used: set[int] = set()
    for option, action in namespace.seen:
        index = _token_index(argv, option, used)
        used.add(index)
        written = argv[index].split("=", 1)[0] if index >= 0 else option
        out.append(
            SetOption(
                index=index, written=written, option=action.option_strings[0], dest=action.dest
            )
        )
    return out


def _token_index(argv: Sequence[str], option: str, used: set[int]) -> int:
    """The first unused token that names ``option`` exactly or as an abbreviation."""
    for index, token in enumerate(argv):
        name = token.split("=", 1)[0]
        if index not in used and name.startswith("--") and option.startswith(name):
            return index
    return -1
