"""vLLM's chat template content format (`renderers/hf.py` `_detect_content_format`), per
detector generation: whether a template loops over a message's content ("openai") or not.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
import jinja2.sandbox

from streams.core.serving.base import ContentFormat


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` tag, so templates using it parse as vLLM parses them."""

    tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension declares a set)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_noop"), [], [], body).set_lineno(lineno)


_ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
)


@functools.lru_cache(maxsize=32)
def detect_vllm_content_format(template: str | None, detector: int = 3) -> ContentFormat:
    """ "openai" when the template iterates over a message's content, as vLLM's detector of
    that generation finds it; "string" otherwise or when the template does not parse."""
    if not template:
        return "string"
    try:
        tree = _ENV.parse(template)
        next(_content_loops(tree, detector))
    except StopIteration:
        return "string"
    except Exception:  # vLLM logs it and falls back to "string"
        return "string"
    return "openai"


def _is_var(node: nodes.Node, name: str, detector: int) -> bool:
    if isinstance(node, nodes.Name):
        return node.ctx == "load" and node.name == name
    if detector >= 3 and isinstance(node, nodes.Getattr) and "." in name:
        base, _, attr = name.rpartition(".")
        return node.attr == attr and _is_var(node.node, base, detector)
    return False


def _is_attr(node: nodes.Node, name: str, key: str, detector: int) -> bool:
    if isinstance(node, nodes.Getitem):
        return (
            _is_var(node.node, name, detector)
            and isinstance(node.arg, nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, nodes.Getattr):
        return _is_var(node.node, name, detector) and node.attr == key
    return False


def _is_var_or_elems(node: nodes.Node, name: str, detector: int, key: str | None = None) -> bool:
    if isinstance(node, nodes.Filter):
        return node.node is not None and _is_var_or_elems(node.node, name, detector, key)
    if isinstance(node, nodes.Test):
        return _is_var_or_elems(node.node, name, detector, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_var_or_elems(node.node, name, detector, key)
    return _is_attr(node, name, key, detector) if key else _is_var(node, name, detector)


def _dotted(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    parts = []
    while isinstance(node, nodes.Getattr):
        parts.append(node.attr)
        node = node.node
    if isinstance(node, nodes.Name):
        parts.append(node.name)
        return ".".join(reversed(parts))
    return None


def _names_of(root: nodes.Node, name: str, detector: int) -> Iterator[str]:
    """`name` and every variable assigned from it (or its elements), breadth first."""
    yield name
    seen = {name}
    pending = deque([name])
    while pending:
        related = pending.popleft()
        for assign in root.find_all(nodes.Assign):
            lhs, rhs = assign.target, assign.node
            found: list[str] = []
            if _is_var_or_elems(rhs, related, detector):
                if not isinstance(lhs, nodes.Name):
                    if detector < 3:
                        raise ValueError("not a name")  # older vLLM's assert: "string"
                else:
                    found.append(lhs.name)
            if detector >= 3:
                if (
                    isinstance(lhs, nodes.Name)
                    and isinstance(rhs, nodes.Call)
                    and isinstance(rhs.node, nodes.Name)
                    and rhs.node.name == "namespace"
                ):
                    found += [
                        f"{lhs.name}.{kw.key}"
                        for kw in rhs.kwargs
                        if _is_var_or_elems(kw.value, related, detector)
                    ]
                elif isinstance(lhs, nodes.Getattr | nodes.NSRef) and _is_var_or_elems(
                    rhs, related, detector
                ):
                    dotted = _dotted(lhs)
                    found += [dotted] if dotted is not None else []
            for alias in found:
                yield alias
                if alias not in seen:
                    seen.add(alias)
                    pending.append(alias)


def _message_names(root: nodes.Node, detector: int) -> list[str]:
    """The loop variables of `{% for message in messages %}` loops (and its aliases)."""
    names = list(_names_of(root, "messages", detector))
    found = []
    for loop in root.find_all(nodes.For):
        for name in names:
            if _is_var_or_elems(loop.iter, name, detector):
                if isinstance(loop.target, nodes.Name):
                    found.append(loop.target.name)
                break
    return found


def _content_loops(root: nodes.Node, detector: int) -> Iterator[nodes.For]:
    """Loops over a message's content, as vLLM's `_iter_nodes_assign_content_item` finds them."""
    messages = _message_names(root, detector)
    macro_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    if detector >= 2:
        for macro in root.find_all(nodes.Macro):
            params = {arg.name for arg in macro.args}
            bound: set[str] = set()
            for call in root.find_all(nodes.Call):
                if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                    continue
                for i, arg in enumerate(call.args):
                    if i < len(macro.args) and any(
                        _is_var_or_elems(arg, m, detector, "content") for m in messages
                    ):
                        bound.add(macro.args[i].name)
                for kw in call.kwargs:
                    if kw.key in params and any(
                        _is_var_or_elems(kw.value, m, detector, "content") for m in messages
                    ):
                        bound.add(kw.key)
            for loop in macro.find_all(nodes.For):
                in_macros.add(id(loop))
                if bound:
                    macro_params[id(loop)] = bound
    for loop in root.find_all(nodes.For):
        if any(_is_var_or_elems(loop.iter, m, detector, "content") for m in messages):
            yield loop
            continue
        if detector < 1 or not isinstance(loop.iter, nodes.Name):
            continue
        bound_here = loop.iter.name in macro_params.get(id(loop), set())
        content_name = loop.iter.name == "content" and (detector < 2 or id(loop) not in in_macros)
        if bound_here or content_name:
            yield loop
