"""A plan's extra engine flags, read as `vllm serve` reads them, and who may set each.

vLLM's parser (``FlexibleArgumentParser``) turns ``_`` into ``-``, merges dotted sub-keys
(``--kv-transfer-config.kv_connector=X``), takes ``-O3`` for ``--optimization-level 3`` and
argparse's unique prefixes (``--hos`` is ``--host``). Any check by spelling misses some of these,
so the flags are parsed here by vLLM's own ``vllm serve`` parser, built once per process (the
import costs seconds: only a plan with extra flags pays it), and each flag it recognises is looked
up by its canonical name in :mod:`console.deployments.engine_flags`.

Two checks use it:

- :func:`validate_engine_args`, the model field's validator, refuses for everyone what nobody
  may set: flags pdserve owns, refused, unclassified or unknown flags, bad values.
- :func:`check_engine_args`, called by every path that writes flags into a plan (a plan create or
  edit, a draft revision, a rollout) with the user behind it: a flag that changes needs its
  class's role (tuning: team admin; superuser: a superuser).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from console.accounts.models import Role
from console.accounts.roles import User, is_superuser, may
from console.deployments.engine_flags import CLASSES, REASONS, FlagClass

FIELD = "extra_engine_args"
# Where the namespace of one parse keeps what the parser gave each action (one list per parse:
# the cached parser is shared between threads, the namespace is not).
_GIVEN = "_pdserve_given"
# argparse's own test for a negative number, which is a value and not a flag.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class EngineArgsError(ValueError):
    """vLLM's parser refused the arguments (unknown, ambiguous, missing value...)."""


@dataclass(frozen=True)
class Given:
    """One flag of the arguments: as written, and as vLLM's parser names it."""

    written: str  # the flag as the user wrote it: --max_num_seqs, --hos
    flag: str  # its canonical name, the table's key: --max-num-seqs, --host
    setting: str  # what it was given, normalized (JSON): tells whether a flag changed

    @property
    def kind(self) -> FlagClass | None:
        return CLASSES.get(self.flag)

    @property
    def named(self) -> str:
        return self.flag if self.written == self.flag else f"{self.written} ({self.flag})"


def canonical(action: argparse.Action) -> str:
    """An action's name in the table: its first long option, else its dest (a positional)."""
    return next((s for s in action.option_strings if s.startswith("--")), action.dest)


@contextlib.contextmanager
def keeping_environment() -> Iterator[None]:
    """Importing vLLM sets variables for torch and triton (LD_LIBRARY_PATH, TORCHINDUCTOR_*):
    the console's processes, and the workers the supervisor starts from its environment, must
    not inherit them from a check."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def load_parser(args: object) -> None:
    """Import vLLM's parser now if checking ``args`` will need it. Call it before a write
    transaction that validates them: the first import in a process takes tens of seconds, and
    minutes on a saturated host; inside the transaction it held the database's write lock
    (SQLite: a rollout's promotion under load failed every other writer, a GET included, with
    "database is locked")."""
    if not args:
        return
    # An engine that cannot be imported is not this function's to report: the field's
    # validator, inside the transaction, refuses the flags naming why (given_flags).
    with contextlib.suppress(ImportError):
        serve_parser()


def load_parser_in_background(args: object) -> None:
    """load_parser on a thread of its own, once per process, for a caller that will need the
    parser later and must not wait for it now: a rollout's promotion checks green's flags, and
    the import made there, under a canary's load, delayed the promotion by over 2 minutes."""
    if args:
        _import_thread()


@functools.cache
def _import_thread() -> threading.Thread:
    # Cached: one import thread per process, however often a caller asks (every tick).
    thread = threading.Thread(target=load_parser, args=(True,), daemon=True,
                              name="vllm-parser-import")
    thread.start()
    return thread


@functools.cache
def serve_parser() -> argparse.ArgumentParser:
    """vLLM's own `vllm serve` parser, made to record instead of act: each action notes what it
    was given on the namespace of the parse, and values are kept as written (types and choices
    are checked afterwards, for the flags that pass, by :func:`_check_values`). Errors raise
    :class:`EngineArgsError` instead of exiting; ``--config`` files are never read. Cached: the
    import of vLLM is paid once per process."""
    with keeping_environment():
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

    class CheckingParser(FlexibleArgumentParser):
        def error(self, message: str) -> Any:  # type: ignore[override]
            raise EngineArgsError(message)

        def exit(self, status: int = 0, message: str | None = None) -> Any:  # type: ignore[override]
            raise EngineArgsError(message or "vllm serve would exit here")

        def _print_message(self, message: str, file: Any = None) -> None:
            pass

        def _pull_args_from_config(self, args: list[str]) -> list[str]:
            raise EngineArgsError("--config reads vLLM options from a file")

    with keeping_environment():
        parser = make_arg_parser(CheckingParser(prog="vllm serve"))
    for action in parser._actions:
        action._pdserve_type = action.type  # type: ignore[attr-defined]
        action._pdserve_choices = action.choices  # type: ignore[attr-defined]
        action.type, action.choices = None, None
        action.__class__ = _recording(type(action))
    return parser


@functools.cache
def _recording(kind: type[argparse.Action]) -> type[argparse.Action]:
    class Recording(kind):  # type: ignore[valid-type, misc]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            if not self.option_strings and values is self.default:
                return  # an optional positional (the model) that was not given
            namespace.__dict__.setdefault(_GIVEN, []).append((self, option_string, values))

    Recording.__name__ = f"Recording{kind.__name__}"
    return Recording


# What one parse gave each action it took: (action, the option string matched, the values).
Fired = list[tuple[argparse.Action, str | None, Any]]


def _fire(args: Sequence[str]) -> Fired:
    """The actions vLLM's parser takes for ``args``, in order; EngineArgsError if it refuses."""
    try:
        namespace = serve_parser().parse_args(list(args))
    except EngineArgsError:
        raise
    except Exception as exc:  # vLLM's pre-processing of odd input (a dotted flag at the end)
        raise EngineArgsError(f"vllm serve cannot parse them ({type(exc).__name__}: {exc})") from exc
    return list(getattr(namespace, _GIVEN, []))


def _groups(args: Sequence[str]) -> list[list[str]]:
    """``args`` cut before each flag: each piece is one flag with its values, for naming a flag
    as it was written."""
    groups: list[list[str]] = []
    for argument in args:
        if argument.startswith("-") and not _NEGATIVE_NUMBER.match(argument) or not groups:
            groups.append([argument])
        else:
            groups[-1].append(argument)
    return groups


def _setting(action: argparse.Action, option_string: str | None, values: Any) -> str:
    negated = bool(option_string and option_string.startswith("--no-")
                   and isinstance(action, argparse.BooleanOptionalAction))
    return json.dumps([negated, values], default=str)


def parse(args: Sequence[str]) -> list[Given]:
    """Every flag vLLM's parser takes in ``args``, named as written and canonically. Raises
    :class:`EngineArgsError` for what it refuses (an unknown or ambiguous flag, a missing value)."""
    return _parse(args)[0]


def _parse(args: Sequence[str]) -> tuple[list[Given], Fired]:
    fired = _fire(args)
    written: dict[int, list[str]] = {}
    for group in _groups(args):
        try:
            actions = _fire(group)
        except EngineArgsError:
            continue  # only for naming: the whole list parsed
        for action, _, _ in actions:
            written.setdefault(id(action), []).append(group[0].split("=", 1)[0])
    given = []
    for action, option_string, values in fired:
        names = written.get(id(action))
        if not action.option_strings:  # a positional argument: name it by its value
            names = [json.dumps(values)]
        given.append(Given(written=names.pop(0) if names else canonical(action),
                           flag=canonical(action), setting=_setting(action, option_string, values)))
    return given, fired


def _check_values(fired: Fired) -> list[str]:
    """vLLM's own type and choice checks of each flag's values."""
    problems = []
    for action, option_string, values in fired:
        convert: Callable[[str], Any] | None = action._pdserve_type  # type: ignore[attr-defined]
        choices = action._pdserve_choices  # type: ignore[attr-defined]
        strings = values if isinstance(values, list) else [values]
        for value in (v for v in strings if isinstance(v, str)):
            try:
                converted = convert(value) if callable(convert) else value
            except Exception as exc:  # each type function raises its own kind
                problems.append(f"{option_string or canonical(action)}: invalid value "
                                f"{value!r} ({exc})")
                continue
            if choices is not None and converted not in choices:
                problems.append(f"{option_string or canonical(action)}: {value!r} is not one of "
                                f"{', '.join(map(str, choices))}")
    return problems


def _shape(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ValidationError('expected a list of vllm serve arguments such as '
                              '["--max-num-seqs", "4"]')
    if value and (not value[0].startswith("-") or _NEGATIVE_NUMBER.match(value[0])):
        raise ValidationError(f"the first argument must be a flag (--name), got {value[0]!r}")
    return value


def given_flags(value: object) -> list[Given]:
    """The flags of a valid list; ValidationError (the messages for the field) otherwise."""
    args = _shape(value)
    if not args:
        return []
    try:
        given, fired = _parse(args)
    except ImportError as exc:
        raise ValidationError(f"vLLM cannot be imported here ({exc}), so extra engine flags "
                              "cannot be checked: leave them empty") from exc
    except EngineArgsError as exc:
        raise ValidationError(f"vllm serve refuses them: {exc}") from exc
    problems = []
    for flag in given:
        kind, reason = flag.kind, REASONS.get(flag.flag, "")
        if kind is None:
            problems.append(f"{flag.named}: pdserve has not classified this vLLM flag, so it is "
                            "refused until it is (console/deployments/engine_flags.py)")
        elif kind is FlagClass.OWNED:
            problems.append(f"{flag.named} is set by pdserve: {reason}")
        elif kind is FlagClass.REFUSED:
            problems.append(f"{flag.named} may not be set: {reason}")
    if problems:
        raise ValidationError(problems)
    problems = _check_values(fired)
    if problems:
        raise ValidationError(problems)
    return given


def validate_engine_args(value: object) -> None:
    """The model field's validator: what nobody may set, whoever asks."""
    given_flags(value)


def _settings(value: object) -> dict[str, list[str]]:
    """{canonical flag: its settings in order} of a stored list, {} if it no longer parses."""
    try:
        given = parse(_shape(value)) if value else []
    except (ValidationError, EngineArgsError, ImportError):
        return {}
    settings: dict[str, list[str]] = {}
    for flag in given:
        settings.setdefault(flag.flag, []).append(flag.setting)
    return settings


def may_set(user: User | None, team_id: int | None, kind: FlagClass) -> bool:
    """Whether ``user`` may set a flag of ``kind`` in the team's plans. None is a management
    command, run by whoever runs the console's machine."""
    if user is None:
        return True
    if kind is FlagClass.SUPERUSER:
        return is_superuser(user)
    if kind is FlagClass.TUNING:
        return may(user, team_id, Role.ADMIN)
    return False


def _needs(kind: FlagClass | None) -> str:
    return ("a superuser" if kind is FlagClass.SUPERUSER
            else "the admin role in the deployment's team")


def check_engine_args(value: object, user: User | None, team_id: int | None,
                      before: object = (), *, author: User | None = None,
                      authored: bool = False) -> None:
    """Raise ValidationError keyed ``extra_engine_args`` unless ``user`` may change the plan's
    flags from ``before`` to ``value``: what nobody may set is refused, and each flag whose
    setting changes (added, removed or given another value) needs its class's role.

    ``authored``: the flags are a draft's, written by ``author``; a changed flag then passes if
    either may set it, the one who wrote it or ``user``, who rolls it out."""
    try:
        given = given_flags(value)
    except ValidationError as exc:
        raise ValidationError({FIELD: exc.messages}) from exc
    old, new = _settings(before), {}
    for flag in given:
        new.setdefault(flag.flag, []).append(flag.setting)
    deciders = [user, author] if authored else [user]
    problems = []
    for name in sorted(set(old) | set(new), key=lambda n: (n not in new, n)):
        kind = CLASSES.get(name)
        # Nobody sets an owned or refused flag, so one here is one removed (stored before these
        # checks): anyone who may write the field may drop it.
        if (old.get(name) == new.get(name) or kind is None
                or kind in (FlagClass.OWNED, FlagClass.REFUSED)
                or any(may_set(u, team_id, kind) for u in deciders)):
            continue
        shown = next((g.named for g in given if g.flag == name), name)
        verb = "setting" if name in new else "removing"
        who = ("neither the one rolling it out nor the draft's author holds it" if authored
               else "you do not hold it")
        problems.append(f"{shown}: {verb} it needs {_needs(kind)} ({REASONS[name]}); {who}")
    if problems:
        raise ValidationError({FIELD: problems})
