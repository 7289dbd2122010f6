"""YAML as RollMux's configuration files read it: what the file says, nothing more.

PyYAML's ``SafeLoader`` follows YAML 1.1, under which a cluster file's ``nodes: 010`` is
8 (octal), ``0x10`` is 16, ``1_0`` is 10, a tenant named ``yes`` or ``null`` is a boolean
or nothing, a key given twice keeps its last value silently, and nine nested aliases
expand into billions of nodes (memory grows until the process dies). ``StrictLoader``
differs in these ways, each refusing or reading literally what the default would turn
into something else:

* integers are decimal digits with an optional sign (``010`` is 10); ``0x10``, ``0o10``
  and ``1_0`` stay strings, which the files' own checks then refuse by name; floats
  are decimal with a point or an exponent, whose sign is optional (``1e3`` and
  ``5.28e0`` are numbers, which YAML 1.1 reads as strings; ``1_000.0`` and the
  sexagesimal ``1:30.0`` stay strings), or ``.inf`` / ``.nan`` (which the checks refuse);
* booleans are ``true`` and ``false`` (any case) only: ``yes``, ``no``, ``on``, ``off``
  are strings;
* a key given twice in one mapping is an error naming the key and its line; so is a key
  that is a sequence or mapping (``? [a, b]``), and a merge key (``<<``);
* aliases (``*name``) are an error: no configuration needs them, and they are how a
  small file becomes a huge document; so is nesting deeper than ``MAX_DEPTH`` levels
  (a 1 KB file of brackets otherwise ended a command in a ``RecursionError``).

``load(text)`` parses with it; errors are ``yaml.YAMLError`` with the line (``problem_mark``).
``dump(data)`` writes YAML that ``load`` and PyYAML's YAML 1.1 ``safe_load`` both read back as
``data``: a string either would read as something else (``1e3``, ``1_000``, ``0x10``, ``yes``,
``null``, ``.inf``) is quoted.
"""
from __future__ import annotations

import re
from collections.abc import Hashable

import yaml

_INT = "tag:yaml.org,2002:int"
#: the deepest nesting of collections a configuration file may have
MAX_DEPTH = 64
_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"
_FLOAT_RE = re.compile(r"""^[-+]?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?
                               |[0-9]+[eE][-+]?[0-9]+|\.(?:inf|Inf|INF))$|^\.(?:nan|NaN|NAN)$""", re.VERBOSE)


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the differences of the module docstring."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"an alias (*{event.anchor}): aliases are not accepted "
                                                          f"here; write the value out", event.start_mark)
        depth = getattr(self, "_depth", 0)
        if depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                              self.peek_event().start_mark)
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                raise yaml.constructor.ConstructorError(None, None, "YAML merge keys (<<) are not supported; write "
                                                        "the keys out", key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):  # (checked before the set: a list raised a bare TypeError)
                raise yaml.constructor.ConstructorError(None, None, "found unhashable key (a sequence or mapping); "
                                                        "a key is a plain value such as a name", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _BOOL, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictLoader.add_implicit_resolver(_INT, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
StrictLoader.add_implicit_resolver(_FLOAT, _FLOAT_RE, list("-+0123456789."))
StrictLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|false)$", re.IGNORECASE), list("tTfF"))
def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    try:
        return int(text, 10)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise yaml.constructor.ConstructorError(None, None, f"an integer of {len(text.lstrip('+-'))} digits, more "
                                                f"than any setting takes", node.start_mark) from None


StrictLoader.add_constructor(_INT, _construct_int)
StrictLoader.add_constructor(_BOOL, lambda loader, node: loader.construct_scalar(node).lower() == "true")


def load(text: str):
    """The document in ``text``, read by ``StrictLoader``."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


class StrictDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes a string ``StrictLoader`` or ``yaml.SafeLoader`` would read as another type."""


StrictDumper.yaml_implicit_resolvers = {
    first: yaml.SafeDumper.yaml_implicit_resolvers.get(first, []) + StrictLoader.yaml_implicit_resolvers.get(first, [])
    for first in {*yaml.SafeDumper.yaml_implicit_resolvers, *StrictLoader.yaml_implicit_resolvers}}


def dump(data) -> str:
    """``data`` (plain dicts, lists, strings, numbers, booleans, None) as YAML, keys in their order;
    ``load`` of it equals ``data``."""
    return yaml.dump(data, Dumper=StrictDumper, sort_keys=False)
