"""Reading the YAML files a researcher writes (campaign specs, testbed files), strictly.

PyYAML's ``safe_load`` keeps the last of two equal keys without a word, so a spec with ``rtts_ms``
twice would silently run only the second list. :func:`load_text` refuses that, and turns every way a
document can fail to parse into a :class:`~bbrlab.core.errors.ValidationError` naming the file.

YAML anchors and aliases are allowed (``&ramp`` / ``*ramp``), but a document whose values, with every
alias expanded, number more than :data:`MAX_EXPANDED_NODES` is refused: nine aliases of nine aliases of
... make a file of a few hundred bytes stand for hundreds of millions of values (the "billion laughs"),
which anything that prints, copies or serialises the value would then build in full. A document is refused
as soon as its parser has built more than that many distinct values too, so a long plain list costs a
fraction of a second to refuse, not a minute.

A file is refused before it is read when it is larger than :data:`MAX_FILE_BYTES` (:func:`load_file`), and a
whole number with more than :data:`MAX_INT_DIGITS` digits is refused naming its key (Python would raise
``ValueError`` from its int-str conversion limit, 4300 digits, and any shorter one is out of every range).
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import yaml

from .errors import ValidationError, key_name

MERGE_TAG = "tag:yaml.org,2002:merge"
#: The most scalars, sequences and mappings a document may stand for once its aliases are expanded. A campaign
#: spec or a testbed file has a few hundred; this leaves room for generated ones and refuses alias bombs.
MAX_EXPANDED_NODES = 100_000
#: The largest YAML file bbrlab reads from a user (a campaign spec, a testbed file), checked with ``stat`` before
#: reading. The specs in specs/ have under 2 KiB; a generated one with thousands of values stays well below.
MAX_FILE_BYTES = 1 << 20
#: The most digits a whole number in such a file may have (a seed below 2**63 has 19).
MAX_INT_DIGITS = 100
INT_TAG = "tag:yaml.org,2002:int"
_NOT_DIGITS = re.compile(r"[^0-9]")


class DuplicateKeyError(yaml.YAMLError):
    """A mapping gives ``key`` twice, on lines ``first_line`` and ``again_line`` (1-based); :func:`load_text`
    turns it into a :class:`~bbrlab.core.errors.ValidationError`."""
    def __init__(self, key: object, first_line: int, again_line: int):
        super().__init__(f"key {key!r} given twice (lines {first_line} and {again_line})")
        self.key, self.first_line, self.again_line = key, first_line, again_line


class TooManyNodesError(yaml.YAMLError):
    """The parser built more than :data:`MAX_EXPANDED_NODES` distinct values."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (merge keys ``<<`` may be overridden) and stops
    composing once it has built more than :data:`MAX_EXPANDED_NODES` nodes."""

    composed_nodes = 0

    def compose_node(self, parent, index):
        if not self.check_event(yaml.AliasEvent):
            self.composed_nodes += 1
            if self.composed_nodes > MAX_EXPANDED_NODES:
                raise TooManyNodesError(f"more than {MAX_EXPANDED_NODES} values")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _value in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: the base class reports it
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(key, first, line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def expanded_size(node: yaml.Node | None, limit: int = MAX_EXPANDED_NODES) -> int:
    """How many nodes ``node`` stands for with every alias expanded (counting stops just above ``limit``).

    PyYAML's composer returns an alias as the very node object of its anchor, so sizes are memoised per node:
    the count costs one visit per distinct node, however large the expansion."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        sizes[key] = limit + 1  # a node reached again while being counted: a recursive alias, never finite
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        sizes[key] = min(total, limit + 1)
        return sizes[key]

    return 0 if node is None else size(node)


def _too_many(field: str, source: str) -> ValidationError:
    return ValidationError(field, source, f"a document of at most {MAX_EXPANDED_NODES} values (list items, keys "
                           "and values, counted with any YAML aliases expanded)")


def long_integer(node: yaml.Node | None, where: str = "") -> tuple[str, int] | None:
    """The first whole number in ``node`` with more than :data:`MAX_INT_DIGITS` digits, as (its key path, like
    ``rtts_ms[0]``, its digit count); None when there is none. Each node is visited once, aliases included."""
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, str]] = [] if node is None else [(node, where)]
    while todo:
        n, path = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.ScalarNode):
            digits = len(_NOT_DIGITS.sub("", n.value)) if n.tag == INT_TAG else 0
            if digits > MAX_INT_DIGITS:
                return path or "(document)", digits
        elif isinstance(n, yaml.SequenceNode):
            todo.extend((c, f"{path}[{i}]") for i, c in enumerate(n.value))
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                name = key_name(k.value) if isinstance(k, yaml.ScalarNode) else "(key)"
                todo.extend([(k, f"{path}.{name} (key)" if path else f"{name} (key)"),
                             (v, f"{path}.{name}" if path else name)])
    return None


def _load(text: str, source: str, field: str) -> object:
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if expanded_size(node) > MAX_EXPANDED_NODES:
            raise _too_many(field, source)
        long = long_integer(node)
        if long is not None:
            raise ValidationError(long[0], f"a whole number of {long[1]} digits (in {source})",
                                  f"a number of at most {MAX_INT_DIGITS} digits")
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def load_text(text: str, source: str, field: str = "spec") -> object:
    """The document in ``text`` (from ``source``, for messages); every failure is a ValidationError."""
    try:
        return _load(text, source, field)
    except TooManyNodesError:
        raise _too_many(field, source) from None
    except DuplicateKeyError as e:
        raise ValidationError(key_name(e.key), f"given twice in {source} (lines {e.first_line} and {e.again_line})",
                              "each key once (YAML would silently keep only the last)") from None
    except yaml.YAMLError as e:
        raise ValidationError(field, source, f"valid YAML ({e})") from None
    except RecursionError:
        raise ValidationError(field, source, "YAML nested less deeply") from None


def read_capped(path: str | Path, field: str, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the user's file ``path`` (``what`` it is, for messages), refused with a
    :class:`~bbrlab.core.errors.ValidationError` naming ``field`` when it is not a regular file of at most
    ``max_bytes``: checked with ``stat`` before it is read, and no more is read either. A file that cannot
    be read raises ``OSError``."""
    path = Path(path)
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise ValidationError(field, str(path), f"a {what}: a regular file")
    if st.st_size > max_bytes:
        raise ValidationError(field, f"{path} ({st.st_size} bytes)", f"a {what} of at most {max_bytes} bytes")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValidationError(field, f"{path} (over {max_bytes} bytes)", f"a {what} of at most {max_bytes} bytes")
    return data


def load_file(path: str | Path, field: str, what: str, max_bytes: int = MAX_FILE_BYTES) -> object:
    """The document in YAML file ``path`` (:func:`read_capped`, then :func:`load_text`)."""
    return load_text(read_capped(path, field, what, max_bytes).decode(), str(path), field)
