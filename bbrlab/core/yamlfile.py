"""Reading the YAML files a researcher writes (campaign specs, testbed files), strictly.

PyYAML's ``safe_load`` keeps the last of two equal keys without a word, so a spec with ``rtts_ms``
twice would silently run only the second list. :func:`load_text` refuses that, and turns every way a
document can fail to parse into a :class:`~bbrlab.core.errors.ValidationError` naming the file.

YAML anchors and aliases are allowed (``&ramp`` / ``*ramp``), but a document whose values, with every
alias expanded, number more than :data:`MAX_EXPANDED_NODES` is refused: nine aliases of nine aliases of
... make a file of a few hundred bytes stand for hundreds of millions of values (the "billion laughs"),
which anything that prints, copies or serialises the value would then build in full.
"""

from __future__ import annotations

import yaml

from .errors import ValidationError, key_name

MERGE_TAG = "tag:yaml.org,2002:merge"
#: The most scalars, sequences and mappings a document may stand for once its aliases are expanded. A campaign
#: spec or a testbed file has a few hundred; this leaves room for generated ones and refuses alias bombs.
MAX_EXPANDED_NODES = 100_000


class DuplicateKeyError(yaml.YAMLError):
    """A mapping gives ``key`` twice, on lines ``first_line`` and ``again_line`` (1-based); :func:`load_text`
    turns it into a :class:`~bbrlab.core.errors.ValidationError`."""
    def __init__(self, key: object, first_line: int, again_line: int):
        super().__init__(f"key {key!r} given twice (lines {first_line} and {again_line})")
        self.key, self.first_line, self.again_line = key, first_line, again_line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (merge keys ``<<`` may be overridden)."""

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


def _load(text: str, source: str, field: str) -> object:
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        size = expanded_size(node)
        if size > MAX_EXPANDED_NODES:
            raise ValidationError(field, source, f"a document of at most {MAX_EXPANDED_NODES} values with its YAML "
                                  "aliases expanded (this one stands for more: aliases nested in aliases?)")
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def load_text(text: str, source: str, field: str = "spec") -> object:
    """The document in ``text`` (from ``source``, for messages); every failure is a ValidationError."""
    try:
        return _load(text, source, field)
    except DuplicateKeyError as e:
        raise ValidationError(key_name(e.key), f"given twice in {source} (lines {e.first_line} and {e.again_line})",
                              "each key once (YAML would silently keep only the last)") from None
    except yaml.YAMLError as e:
        raise ValidationError(field, source, f"valid YAML ({e})") from None
    except RecursionError:
        raise ValidationError(field, source, "YAML nested less deeply") from None
