"""A small renderer of Helm charts, for machines without `helm` (CI): the subset of Go's text/template and
Helm's functions that deploy/helm/pyvgpu uses, and nothing more.

It is stricter than Helm where that finds mistakes: a `.Values` path that values.yaml lacks is an error
(as `helm lint --strict` makes it), and so is a function or construct it does not know, so a chart that
drifts beyond this subset fails its test here instead of rendering something else than Helm would.
Where `helm` is installed, the tests render with it as well and compare the two (test_cluster_chart.py).

Functions: include, required, fail, default, printf, quote, toYaml, indent, nindent, trunc, trimSuffix,
replace, regexReplaceAll, b64enc, sha256sum, int, list, eq, ne, and, or, not, genCA, genSignedCert (the
last two make placeholders, not certificates: the test checks where they go, not cryptography).
Control: if / else if / else, with / else, range (lists and maps, with `$i, $v :=`), define, variables
(`:=`, `=`), comments, trim markers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ChartError(Exception):
    """The chart cannot be rendered; the message names the template and what is wrong."""


class _Missing(ChartError):
    pass


_ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.S)
_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)|(?P<num>-?\d+(?:\.\d+)?)|(?P<decl>:=|=)|"""
                    r"""(?P<punct>[()|,])|(?P<word>[$.A-Za-z_][$.\w]*))""")


FUNCTIONS = {"include", "required", "fail", "default", "printf", "quote", "toYaml", "indent", "nindent", "trunc",
             "trimSuffix", "replace", "regexReplaceAll", "b64enc", "sha256sum", "int", "list", "eq", "ne", "and", "or",
             "not", "genCA", "genSignedCert"}


def _tokens(src: str, where: str) -> list[tuple[str, str]]:
    """The tokens of one action; like Go's parser, a function it does not know is an error here."""
    out, pos = [], 0
    src = src.strip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m or m.end() == pos:
            raise ChartError(f"{where}: cannot read {src[pos:pos + 30]!r}")
        kind = m.lastgroup
        word = m.group(kind)
        if kind == "word" and not word.startswith((".", "$")) and word not in FUNCTIONS | {"true", "false", "nil"}:
            raise ChartError(f"{where}: the function {word!r} is not supported by this renderer (tests/cluster/"
                             "helm_lite.py); use one it knows, or add it there")
        out.append((kind, word))
        pos = m.end()
        while pos < len(src) and src[pos].isspace():
            pos += 1
    return out


@dataclass
class _Node:
    kind: str  # text, expr, if, range, with, define
    text: str = ""
    expr: list = field(default_factory=list)
    body: list = field(default_factory=list)
    orelse: list = field(default_factory=list)
    where: str = ""


def _parse(src: str, name: str) -> list[_Node]:
    """Template text -> a tree of nodes (defines included, as nodes of kind 'define')."""
    pieces: list[tuple[str, str, str]] = []  # (text) or (action, content)
    pos = 0
    for m in _ACTION.finditer(src):
        pieces.append(("text", src[pos:m.start()], ""))
        ltrim, content, rtrim = m.group(1), m.group(2), m.group(3)
        if ltrim and not (content[:1].isspace() or content.startswith("/*")):
            raise ChartError(f"{name}: '{{{{-' must be followed by a space: {m.group(0)[:40]!r}")
        pieces.append(("action", content, ("L" if ltrim else "") + ("R" if rtrim else "")))
        pos = m.end()
    pieces.append(("text", src[pos:], ""))
    # trim markers
    for i, (kind, _, trim) in enumerate(pieces):
        if kind != "action":
            continue
        if "L" in trim and i > 0:
            pieces[i - 1] = ("text", pieces[i - 1][1].rstrip(" \t\r\n"), "")
        if "R" in trim and i + 1 < len(pieces):
            pieces[i + 1] = ("text", pieces[i + 1][1].lstrip(" \t\r\n"), "")
    root: list[_Node] = []
    stack: list[tuple[_Node | None, list[_Node]]] = [(None, root)]
    line = 1
    for kind, content, _ in pieces:
        where = f"{name}:{line}"
        line += content.count("\n")
        cur = stack[-1][1]
        if kind == "text":
            if content:
                cur.append(_Node("text", text=content))
            continue
        c = content.strip()
        if c.startswith("/*"):
            if not c.endswith("*/"):
                raise ChartError(f"{where}: unterminated comment")
            continue
        word = c.split(None, 1)[0] if c else ""
        rest = c[len(word):].strip()
        if word in ("if", "range", "with", "define"):
            node = _Node(word, where=where)
            if word == "define":
                node.text = json.loads(rest)
            else:
                node.expr = _tokens(rest, where)
            cur.append(node)
            stack.append((node, node.body))
        elif word == "else":
            owner = stack[-1][0]
            if owner is None or owner.kind not in ("if", "range", "with"):
                raise ChartError(f"{where}: else without if, range or with")
            if rest.startswith("if "):  # else if: a nested if in the else branch, closed by the same end
                inner = _Node("if", expr=_tokens(rest[3:], where), where=where)
                owner.orelse.append(inner)
                stack[-1] = (owner, owner.orelse)
                stack.append((inner, inner.body))
                inner.text = "elseif"
            else:
                stack[-1] = (owner, owner.orelse)
        elif word == "end":
            if len(stack) == 1:
                raise ChartError(f"{where}: end without a block")
            node, _ = stack.pop()
            while node is not None and node.text == "elseif":  # an else-if chain ends with its owner
                node, _ = stack.pop()
        elif word in ("template", "block"):
            raise ChartError(f"{where}: '{word}' is not supported here: use include")
        else:
            cur.append(_Node("expr", expr=_tokens(c, where), where=where))
    if len(stack) != 1:
        raise ChartError(f"{name}: {stack[-1][0].kind} at {stack[-1][0].where} has no end")
    return root


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "", [], {}) if not isinstance(v, (dict, list)) else bool(v)


def _show(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        raise ChartError(f"a map or list is printed as Go would ({str(v)[:40]}...): pipe it to toYaml")
    return str(v)


def _go_printf(fmt: str, *args: Any) -> str:
    out, ai = [], 0
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "%" and i + 1 < len(fmt):
            verb = fmt[i + 1]
            i += 2
            if verb == "%":
                out.append("%")
                continue
            if ai >= len(args):
                raise ChartError(f"printf {fmt!r}: too few arguments")
            a = args[ai]
            ai += 1
            if verb in "sv":
                out.append(_show(a))
            elif verb == "d":
                out.append(str(int(a)))
            elif verb == "q":
                out.append(json.dumps(_show(a)))
            else:
                raise ChartError(f"printf verb %{verb} is not supported here")
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n") if v not in (None, "") else ""


def _indent(n: int, s: str) -> str:
    return "\n".join((" " * int(n) + line) if line else line for line in _show(s).split("\n"))


class Renderer:
    def __init__(self, chart: Path, values: dict | None = None, release: str = "rel", namespace: str = "default",
                 kube_version: tuple[str, str] = ("1", "32")) -> None:
        self.chart = Path(chart)
        meta = yaml.safe_load((self.chart / "Chart.yaml").read_text())
        defaults = yaml.safe_load((self.chart / "values.yaml").read_text()) or {}
        self.values = _merge(defaults, values or {})
        self.top = {
            "Values": self.values,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True},
            "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta.get("appVersion", "")},
            "Capabilities": {"KubeVersion": {"Major": kube_version[0], "Minor": kube_version[1],
                                             "Version": f"v{kube_version[0]}.{kube_version[1]}.0"}},
        }
        self.files = {p.name: _parse(p.read_text(), p.name) for p in sorted((self.chart / "templates").iterdir())
                      if p.suffix in (".yaml", ".tpl", ".txt")}
        self.defines: dict[str, list[_Node]] = {}
        for nodes in self.files.values():
            self._collect_defines(nodes)
        self.value_refs: set[str] = set()

    def _collect_defines(self, nodes: list[_Node]) -> None:
        for n in nodes:
            if n.kind == "define":
                self.defines[n.text] = n.body

    # -- evaluation ----------------------------------------------------------------------------------------

    def _field(self, base: Any, path: list[str], where: str, label: str) -> Any:
        v = base
        walked = label
        for part in path:
            walked += "." + part
            if isinstance(v, dict) and part in v:
                v = v[part]
            else:
                raise _Missing(f"{where}: {walked} does not exist" + (" in values.yaml" if
                                                                       walked.startswith(".Values") else ""))
        if walked.startswith(".Values."):
            self.value_refs.add(walked[len(".Values."):])
        return v

    def _operand(self, tok: tuple[str, str], dot: Any, scope: list[dict], where: str) -> Any:
        kind, text = tok
        if kind == "str":
            return json.loads(text) if text.startswith('"') else text[1:-1]
        if kind == "num":
            return float(text) if "." in text else int(text)
        if text in ("true", "false"):
            return text == "true"
        if text == "nil":
            return None
        if text == ".":
            return dot
        if text.startswith("."):
            parts = text[1:].split(".")
            if dot is self.top or (isinstance(dot, dict) and "Values" in dot and dot.get("Values") is self.values):
                return self._field(dot, parts, where, "")
            return self._field(dot, parts, where, "")
        if text.startswith("$"):
            name, *parts = text.split(".")
            for s in reversed(scope):
                if name in s:
                    base = s[name]
                    label = "" if base is self.top else name
                    return self._field(base, parts, where, label) if parts else base
            raise ChartError(f"{where}: undefined variable {name}")
        raise ChartError(f"{where}: {text!r} where a value was expected")

    def _split(self, toks: list, sep: str) -> list[list]:
        parts, cur, depth = [], [], 0
        for t in toks:
            if t == ("punct", "("):
                depth += 1
            elif t == ("punct", ")"):
                depth -= 1
            if depth == 0 and t == ("punct", sep):
                parts.append(cur)
                cur = []
            else:
                cur.append(t)
        parts.append(cur)
        return parts

    def _args(self, toks: list, dot: Any, scope: list[dict], where: str) -> list[Any]:
        out, i = [], 0
        while i < len(toks):
            if toks[i] == ("punct", "("):
                depth, j = 1, i + 1
                while depth:
                    if j >= len(toks):
                        raise ChartError(f"{where}: unbalanced parentheses")
                    depth += {("punct", "("): 1, ("punct", ")"): -1}.get(toks[j], 0)
                    j += 1
                out.append(self.pipeline(toks[i + 1:j - 1], dot, scope, where))
                i = j
            else:
                out.append(self._operand(toks[i], dot, scope, where))
                i += 1
        return out

    def pipeline(self, toks: list, dot: Any, scope: list[dict], where: str) -> Any:
        decl = None
        if len(toks) > 2 and toks[0][0] == "word" and toks[0][1].startswith("$") and toks[1][0] == "decl":
            decl, toks = (toks[0][1], toks[1][1]), toks[2:]
        value: Any = None
        for i, cmd in enumerate(self._split(toks, "|")):
            if not cmd:
                raise ChartError(f"{where}: empty command in a pipeline")
            head = cmd[0]
            if head[0] == "word" and not head[1].startswith((".", "$")) and head[1] not in ("true", "false", "nil"):
                args = self._args(cmd[1:], dot, scope, where)
                if i > 0:
                    args.append(value)
                value = self.call(head[1], args, dot, scope, where)
            else:
                if len(cmd) != 1 and head != ("punct", "("):
                    raise ChartError(f"{where}: {head[1]!r} is not a function")
                if i > 0:
                    raise ChartError(f"{where}: a value cannot take a piped argument")
                value = self._args(cmd, dot, scope, where)[0]
        if decl:
            name, op = decl
            if op == ":=":
                scope[-1][name] = value
            else:
                for s in reversed(scope):
                    if name in s:
                        s[name] = value
                        break
                else:
                    raise ChartError(f"{where}: assignment to undeclared {name}")
            return None
        return value

    def call(self, fn: str, a: list, dot: Any, scope: list[dict], where: str) -> Any:
        def need(n: int) -> None:
            if len(a) != n:
                raise ChartError(f"{where}: {fn} takes {n} arguments, got {len(a)}")

        if fn == "include":
            need(2)
            if a[0] not in self.defines:
                raise ChartError(f"{where}: include of undefined template {a[0]!r}")
            return self._render(self.defines[a[0]], a[1], [{"$": a[1]}])
        if fn == "required":
            need(2)
            if not _truthy(a[1]):
                raise ChartError(f"{where}: {a[0]}")
            return a[1]
        if fn == "fail":
            need(1)
            raise ChartError(f"{where}: {a[0]}")
        if fn == "default":
            need(2)
            return a[1] if _truthy(a[1]) else a[0]
        if fn == "printf":
            return _go_printf(a[0], *a[1:])
        if fn == "quote":
            return " ".join(json.dumps(_show(x)) for x in a)
        if fn == "toYaml":
            need(1)
            return _to_yaml(a[0])
        if fn in ("indent", "nindent"):
            need(2)
            return ("\n" if fn == "nindent" else "") + _indent(a[0], a[1])
        if fn == "trunc":
            need(2)
            return _show(a[1])[: a[0]]
        if fn == "trimSuffix":
            need(2)
            s = _show(a[1])
            return s[: -len(a[0])] if a[0] and s.endswith(a[0]) else s
        if fn == "replace":
            need(3)
            return _show(a[2]).replace(a[0], a[1])
        if fn == "regexReplaceAll":
            need(3)
            return re.sub(a[0], a[2].replace("$", "\\"), _show(a[1]))
        if fn == "b64enc":
            need(1)
            return base64.b64encode(_show(a[0]).encode()).decode()
        if fn == "sha256sum":
            need(1)
            return hashlib.sha256(_show(a[0]).encode()).hexdigest()
        if fn == "int":
            need(1)
            return int(a[0])
        if fn == "list":
            return list(a)
        if fn in ("eq", "ne"):
            need(2)
            return (a[0] == a[1]) == (fn == "eq")
        if fn == "and":
            for x in a:
                if not _truthy(x):
                    return x
            return a[-1]
        if fn == "or":
            for x in a:
                if _truthy(x):
                    return x
            return a[-1]
        if fn == "not":
            need(1)
            return not _truthy(a[0])
        if fn == "genCA":
            need(2)
            return {"Cert": f"-----CA {a[0]} {a[1]} days-----", "Key": f"-----CA KEY {a[0]}-----"}
        if fn == "genSignedCert":
            need(5)
            names = ",".join(a[2] or [])
            return {"Cert": f"-----CERT {a[0]} [{names}] {a[3]} days by {a[4]['Cert']}-----",
                    "Key": f"-----KEY {a[0]}-----"}
        raise AssertionError(f"{fn} is in FUNCTIONS but not implemented")

    def _render(self, nodes: list[_Node], dot: Any, scope: list[dict]) -> str:
        out: list[str] = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "define":
                continue
            elif n.kind == "expr":
                v = self.pipeline(n.expr, dot, scope, n.where)
                out.append(_show(v))
            elif n.kind == "if":
                scope.append({})
                try:
                    cond = self.pipeline(n.expr, dot, scope, n.where)
                    out.append(self._render(n.body if _truthy(cond) else n.orelse, dot, scope))
                finally:
                    scope.pop()
            elif n.kind == "with":
                scope.append({})
                try:
                    v = self.pipeline(n.expr, dot, scope, n.where)
                    out.append(self._render(n.body, v, scope) if _truthy(v) else self._render(n.orelse, dot, scope))
                finally:
                    scope.pop()
            elif n.kind == "range":
                out.append(self._range(n, dot, scope))
        return "".join(out)

    def _range(self, n: _Node, dot: Any, scope: list[dict]) -> str:
        toks, names = n.expr, []
        if ("decl", ":=") in toks:
            k = toks.index(("decl", ":="))
            names = [t[1] for t in toks[:k] if t[0] == "word"]
            toks = toks[k + 1:]
        seq = self.pipeline(toks, dot, scope, n.where)
        items = list(enumerate(seq)) if isinstance(seq, list) else sorted(seq.items()) if isinstance(seq, dict) \
            else [] if seq is None else None
        if items is None:
            raise ChartError(f"{n.where}: range over {type(seq).__name__}")
        if not items:
            return self._render(n.orelse, dot, scope)
        out = []
        for k, v in items:
            frame = {}
            if len(names) == 1:
                frame[names[0]] = v
            elif len(names) == 2:
                frame[names[0]], frame[names[1]] = k, v
            scope.append(frame)
            try:
                out.append(self._render(n.body, v, scope))
            finally:
                scope.pop()
        return "".join(out)

    # -- the chart -----------------------------------------------------------------------------------------

    def render(self) -> dict[str, str]:
        """{template file: rendered text} of every template but the helpers (files starting with _)."""
        out = {}
        for name, nodes in self.files.items():
            if name.startswith("_"):
                continue
            try:
                out[name] = self._render(nodes, self.top, [{"$": self.top}])
            except RecursionError:
                raise ChartError(f"{name}: include recursion") from None
        return out

    def manifests(self) -> list[dict]:
        """Every Kubernetes object the chart makes, YAML-parsed (NOTES.txt aside)."""
        docs = []
        for name, text in self.render().items():
            if name == "NOTES.txt":
                continue
            try:
                docs += [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as e:
                raise ChartError(f"{name} renders to text that is not YAML: {e}\n---\n{text}") from None
        return docs


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def value_paths(values: Any, prefix: str = "") -> set[str]:
    """Every dotted path of a values tree (maps only: a list is a leaf)."""
    out = set()
    if isinstance(values, dict):
        for k, v in values.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.add(p)
            out |= value_paths(v, p)
    return out
