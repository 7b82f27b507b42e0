"""Reading the YAML files a researcher writes (campaign specs, testbed files), strictly.

PyYAML's ``safe_load`` keeps the last of two equal keys without a word, so a spec with ``rtts_ms``
twice would silently run only the second list. :func:`load_text` refuses that, and turns every way a
document can fail to parse into a :class:`~bbrlab.errors.ValidationError` naming the file.
"""

from __future__ import annotations

import yaml

from .errors import ValidationError, key_name

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
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


def load_text(text: str, source: str, field: str = "spec") -> object:
    """The document in ``text`` (from ``source``, for messages); every failure is a ValidationError."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as e:
        raise ValidationError(key_name(e.key), f"given twice in {source} (lines {e.first_line} and {e.again_line})",
                              "each key once (YAML would silently keep only the last)") from None
    except yaml.YAMLError as e:
        raise ValidationError(field, source, f"valid YAML ({e})") from None
    except RecursionError:
        raise ValidationError(field, source, "YAML nested less deeply") from None
