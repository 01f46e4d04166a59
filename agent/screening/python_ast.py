"""AST screening of a Python kernel file: resolves aliases, then applies the policy to every name, call and import.

`analyse_python(source, rules, function_name)` parses the source, tracks every way a module or function can be
renamed (`import torch.nn.functional as G`, `from torch import softmax as s`, `t = torch`, `getattr(torch, "x")`),
and reports each refused construct with its line. Beyond module references it is an allow-list (see
`agent.screening.policy`): names must be bound by the file or be allowed builtins, attributes of untyped values must
be on the host or device allow-list (any on `self`), attributes are assigned only on `self`, and no string spells a
dunder. It also returns the facts a language needs for its structural checks (top-level functions, device-code
functions, which top-level functions name which). Whether kernels are launched is not judged here: a static check by
name was too strict (a kernel picked from a per-shape cache) and easily fooled, so it is checked at run time
(`forge.checking.launch_check`).
Language-specific parts (which modules the language adds, which decorators mark device code, how the language's
own names are judged, which attributes device code may read) come in `PythonRules`.
"""

from __future__ import annotations

import ast
import builtins
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agent.screening import policy
from agent.screening.violation import Violation

__all__ = ["PythonAnalysis", "PythonRules", "analyse_python"]

_MAX_CONSTRUCT = 80


@dataclass(frozen=True)
class PythonRules:
    """Language-specific inputs to the Python screener.

    `extra_import_roots`: modules the language adds to `policy.ALLOWED_IMPORT_ROOTS` (e.g. `triton`).
    `reference_rules`: root module -> function(qualname) returning why a reference is refused (or None); roots
    without a rule allow every public name. `namespaces`: dotted names that are not modules but may be imported or
    aliased like one (e.g. `triton.runtime.driver`). `device_decorators`: qualnames whose decorated functions are
    device code (e.g. `triton.jit`); tensor-method and `@` rules do not apply inside device code. `torch_allowed`:
    an extra predicate over `torch.*` qualnames a screening mode may also use and subclass (module problems allow
    `torch.nn` layer classes and `torch.nn.init`, to build the same parameters as the reference model).
    `device_attributes`: the attributes device code may read on values screening cannot type (e.g. the public
    methods of Triton's tensor and dtype); host code gets `policy.HOST_ATTRIBUTES`.
    """

    extra_import_roots: frozenset[str] = frozenset()
    reference_rules: Mapping[str, Callable[[str], str | None]] = field(default_factory=dict)
    torch_allowed: Callable[[str], bool] | None = None
    namespaces: frozenset[str] = frozenset()
    device_decorators: frozenset[str] = frozenset()
    device_attributes: Callable[[], frozenset[str]] | None = None

    @property
    def import_roots(self) -> frozenset[str]:
        return policy.ALLOWED_IMPORT_ROOTS | self.extra_import_roots


@dataclass
class PythonAnalysis:
    """Result of `analyse_python`: violations plus facts for structural checks (empty when the source failed to parse).

    `functions`: top-level function definitions by name. `device_functions`: names of functions decorated as device
    code (or wrapped by a device decorator call). `calls`: for each top-level function, the top-level functions it
    names.
    """

    tree: ast.Module | None
    violations: list[Violation]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    device_functions: set[str] = field(default_factory=set)
    calls: dict[str, set[str]] = field(default_factory=dict)

    def reachable_functions(self, entry: str) -> list[str]:
        """Top-level functions reachable from `entry` by name (entry first)."""
        seen: list[str] = []
        todo = [entry]
        while todo:
            name = todo.pop()
            if name in seen or name not in self.functions or name in self.device_functions:
                continue
            seen.append(name)
            todo.extend(sorted(self.calls.get(name, ())))
        return seen


def _text(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - unparse of odd nodes: fall back to the node type
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= _MAX_CONSTRUCT else text[: _MAX_CONSTRUCT - 3] + "..."


def _is_static(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


_BUILTIN_NAMES = frozenset(dir(builtins))
_DUNDER_STRING = re.compile(r"^__\w+__$")
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _folded_string(node: ast.AST) -> str | None:
    """The value of a string built only from constants (`"__glob" + "als__"`, f-strings of constants), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded_string(node.left), _folded_string(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_folded_string(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
    return None


def _scope_bindings(body: Iterable[ast.AST]) -> set[str]:
    """Names a block of statements binds in its own scope (not inside nested functions, classes, lambdas or
    comprehensions, whose names are their own)."""
    names: set[str] = set()
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo.extend(node.decorator_list)
            continue
        if isinstance(node, (ast.Lambda, *_COMPREHENSIONS)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        todo.extend(ast.iter_child_nodes(node))
    return names


class _Analyser:
    def __init__(self, tree: ast.Module, rules: PythonRules, function_name: str | None) -> None:
        self.tree = tree
        self.rules = rules
        self.function_name = function_name
        self.roots = rules.import_roots
        self.violations: list[Violation] = []
        self.parents: dict[int, ast.AST] = {}
        self.aliases: dict[str, set[str]] = {}
        self.import_modules: set[str] = set()  # qualnames bound by `import x` (always modules)
        self.device_nodes: set[int] = set()
        self.finfo_names: set[str] = set()
        self._locals_cache: dict[int, set[str]] = {}

    # -- helpers ------------------------------------------------------------------------------------------
    def flag(self, construct: str, node: ast.AST | None, message: str, kind: str = "forbidden") -> None:
        line = getattr(node, "lineno", 0) if node is not None else 0
        self.violations.append(Violation(construct, int(line or 0), message, kind))  # type: ignore[arg-type]

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def resolve(self, node: ast.AST) -> set[str] | None:
        """Qualified names an expression may refer to, when it is rooted in an imported name."""
        if isinstance(node, ast.Name):
            found = self.aliases.get(node.id)
            return set(found) if found else None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return {f"{q}.{node.attr}" for q in base} if base else None
        if self._is_getattr_call(node):
            assert isinstance(node, ast.Call)
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                base = self.resolve(node.args[0])
                return {f"{q}.{name.value}" for q in base} if base else None
        return None

    def _is_getattr_call(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2)

    def is_namespace(self, qualname: str) -> bool:
        """A module (or a module-like namespace such as `triton.runtime.driver`)."""
        if qualname in self.import_modules or qualname in self.rules.namespaces:
            return True
        if qualname.split(".")[0] not in self.roots:
            return False
        return isinstance(policy.lookup(qualname), types.ModuleType)

    def is_function_local(self, name: str, node: ast.AST) -> bool:
        """Whether `name` at `node` is a local of the nearest enclosing function (so it cannot be the builtin).

        Default values, decorators and annotations belong to the enclosing scope; module-level, class-level and
        comprehension bindings do not shadow builtins safely (`eval = eval` still reads the builtin).
        """
        child, parent = node, self.parent(node)
        while parent is not None:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                body = parent.body if isinstance(parent.body, list) else [parent.body]
                if any(child is stmt for stmt in body):
                    return name in self._local_names(parent)
            child, parent = parent, self.parent(parent)
        return False

    def _local_names(self, fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
        cached = self._locals_cache.get(id(fn))
        if cached is not None:
            return cached
        args = fn.args
        names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        declared: set[str] = set()
        body = fn.body if isinstance(fn.body, list) else [fn.body]
        todo: list[ast.AST] = list(body)
        while todo:
            sub = todo.pop()
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
                continue  # nested scope
            if isinstance(sub, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                continue  # own scope; its bindings do not shadow here
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                names.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in sub.names)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                names.add(sub.name)
            elif isinstance(sub, (ast.Global, ast.Nonlocal)):
                declared.update(sub.names)
            todo.extend(ast.iter_child_nodes(sub))
        result = names - declared
        self._locals_cache[id(fn)] = result
        return result

    def in_device_code(self, node: ast.AST) -> bool:
        return id(node) in self.device_nodes

    # -- passes -------------------------------------------------------------------------------------------
    def run(self) -> None:
        for parent in ast.walk(self.tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[id(child)] = parent
        self.collect_aliases()
        self.collect_device_code()
        self.module_names = _scope_bindings(self.tree.body)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Global):
                self.module_names.update(node.names)
        self.own_classes = {n.name for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)}
        self.own_methods = {f.name for c in ast.walk(self.tree) if isinstance(c, ast.ClassDef) for f in c.body
                            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_static(f)}
        for node in ast.walk(self.tree):
            self.visit(node)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                self.check_unbound_method(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(self.parent(node),
                                                                                         ast.ClassDef):
                self.check_method_decorators(node)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super" \
                    and (node.args or node.keywords) and not self.is_bound("super", node):
                self.flag("super", node, f"`{_text(node)}` binds a method to an object of the file's choice; "
                          "use super() without arguments")

    def collect_aliases(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self._bind(alias.asname, {alias.name})
                        self.import_modules.add(alias.name)
                    else:
                        root = alias.name.split(".")[0]
                        self._bind(root, {root})
                        self.import_modules.add(root)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self._bind(alias.asname or alias.name, {f"{node.module}.{alias.name}"})
        # Assignments can chain (`a = torch; b = a`): iterate to a fixed point.
        for _ in range(20):
            changed = False
            for node in ast.walk(self.tree):
                for target, value in self._simple_bindings(node):
                    found = self.resolve(value)
                    if found and not found <= self.aliases.get(target, set()):
                        self._bind(target, found)
                        changed = True
            if not changed:
                break
        for node in ast.walk(self.tree):
            for target, value in self._simple_bindings(node):
                if isinstance(value, ast.Call) and (self.resolve(value.func) or set()) & {"torch.finfo", "torch.iinfo"}:
                    self.finfo_names.add(target)

    def _bind(self, name: str, qualnames: set[str]) -> None:
        self.aliases.setdefault(name, set()).update(qualnames)

    @staticmethod
    def _simple_bindings(node: ast.AST) -> Iterable[tuple[str, ast.AST]]:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.value
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            if isinstance(node.target, ast.Name):
                yield node.target.id, node.value

    def is_device_decorator(self, decorator: ast.AST) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return bool((self.resolve(target) or set()) & self.rules.device_decorators)

    def collect_device_code(self) -> None:
        self.device_functions: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                self.is_device_decorator(d) for d in node.decorator_list
            ):
                self.device_functions.add(node.name)
                for stmt in node.body:
                    self.device_nodes.update(id(n) for n in ast.walk(stmt))
        # `k = triton.jit(fn)`: fn's body is device code and k is a device function.
        wrapped: set[str] = set()
        for node in ast.walk(self.tree):
            for target, value in self._simple_bindings(node):
                if isinstance(value, ast.Call) and self.is_device_decorator(value) and value.args:
                    arg = value.args[0]
                    if isinstance(arg, ast.Name):
                        wrapped.add(arg.id)
                    self.device_functions.add(target)
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wrapped:
                self.device_functions.add(node.name)
                for stmt in node.body:
                    self.device_nodes.update(id(n) for n in ast.walk(stmt))

    # -- checks -------------------------------------------------------------------------------------------
    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                problem = policy.import_problem(alias.name, self.roots)
                if problem:
                    self.flag(f"import {alias.name}", node, f"`import {alias.name}`: {problem}")
                else:
                    self.check_namespace(alias.name, node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            self.check_import_from(node)
        elif isinstance(node, ast.Name):
            self.check_name(node)
        elif isinstance(node, ast.Attribute):
            self.check_attribute(node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            if not self.in_device_code(node):
                self.flag("@", node, f"`{_text(node)}` uses the matrix-multiply operator `@` (torch.matmul); the "
                          "kernel must compute the product itself")
        elif isinstance(node, ast.ClassDef):
            self.check_class(node)
        elif isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr)):
            self.check_string(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in {"__torch_function__", "__torch_dispatch__"}:
                self.flag(node.name, node, f"defines {node.name}, a tensor-subclass hook (lazy or fake tensors); "
                          "kernels must return plain tensors")
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                if _is_dunder(name):
                    self.flag(name, node, f"rebinds {name}")

    def check_import_from(self, node: ast.ImportFrom) -> None:
        if node.level:
            construct = f"from {'.' * node.level}{node.module or ''} import"
            self.flag(construct, node, f"`{construct}`: relative imports are not allowed; a kernel file must be "
                      "self-contained")
            return
        module = node.module or ""
        problem = policy.import_problem(module, self.roots)
        if problem:
            self.flag(f"from {module} import", node, f"`from {module} import`: {problem}")
            return
        for alias in node.names:
            if alias.name == "*":
                self.flag(f"from {module} import *", node, f"`from {module} import *` hides which names are used; "
                          "import names explicitly")
                continue
            qualname = f"{module}.{alias.name}"
            if _is_dunder(alias.name) and alias.name not in policy.SAFE_DUNDERS:
                self.flag(qualname, node, f"imports {qualname}, a dunder internal")
            elif self.is_namespace(qualname):
                self.check_namespace(qualname, node, f"from {module} import {alias.name}")
            else:
                self.check_reference(qualname, node, f"from {module} import {alias.name}")

    def check_name(self, node: ast.Name) -> None:
        name = node.id
        load = isinstance(node.ctx, ast.Load)
        if load and name in _BUILTIN_NAMES and name not in policy.SAFE_BUILTINS and name not in self.aliases:
            if not self.is_function_local(name, node):  # `eval = eval` at module level still reads the builtin
                self.flag_builtin(name, node)
                return
        if _is_dunder(name) and name not in policy.SAFE_DUNDERS:
            self.flag(name, node, f"{name} is an interpreter internal; not allowed in kernels")
            return
        if load and name not in _BUILTIN_NAMES and not self.is_bound(name, node):
            self.flag(name, node, f"`{name}` is not defined in the file (not imported, assigned, defined or a "
                      "parameter); kernels may use only names they bind and the allowed builtins")
            return
        if load and name in self.aliases:
            self.check_chain(node)

    def flag_builtin(self, name: str, node: ast.AST) -> None:
        if name in policy.GETATTR_FAMILY:
            construct = name if name == "getattr" else f"{name}()"
            self.flag(construct, node, f"{name} reads or writes attributes by name (getattr, setattr, delattr, "
                      "hasattr are refused); use attribute access with a fixed name")
        elif name in policy.BANNED_BUILTINS:
            self.flag(f"{name}()", node, f"{name} is {policy.BANNED_BUILTINS[name]}; not allowed in kernels")
        else:
            self.flag(f"{name}()", node, f"{name} is not on the allow-list of builtins kernels may use "
                      "(containers, numbers, len/range/zip/min/max..., isinstance, exceptions)")

    def is_bound(self, name: str, node: ast.AST) -> bool:
        """Whether `name` at `node` is bound by the file: in an enclosing function, lambda or comprehension, in the
        class body it sits in directly, or at module level."""
        child, parent = node, self.parent(node)
        in_function = False
        while parent is not None:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                body = parent.body if isinstance(parent.body, list) else [parent.body]
                if any(child is stmt for stmt in body):
                    if name in self._local_names(parent):
                        return True
                    in_function = True
            elif isinstance(parent, _COMPREHENSIONS):
                if any(name in _scope_bindings([g.target]) for g in parent.generators):
                    return True
            elif isinstance(parent, ast.ClassDef) and not in_function and any(child is stmt for stmt in parent.body):
                if name in _scope_bindings(parent.body):
                    return True
            child, parent = parent, self.parent(parent)
        return name in self.module_names

    def check_attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if _is_dunder(attr) and attr not in policy.SAFE_DUNDERS:
            self.flag(f".{attr}", node, f"`{_text(node)}` accesses {attr}, an interpreter or tensor internal; not "
                      "allowed in kernels")
            return
        if attr in policy.FRAME_ATTRIBUTES:
            self.flag(f".{attr}", node, f"`{_text(node)}` is frame introspection; not allowed in kernels")
            return
        if attr in policy.BANNED_ATTRIBUTES:
            self.flag(f".{attr}", node, f"`{_text(node)}` is a {policy.BANNED_ATTRIBUTES[attr]}; not allowed")
            return
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            root = self._chain_root(node)
            if root is not None and self.resolve(root):
                target = sorted(self.resolve(node) or {_text(node)})[0]
                self.flag(target, node, f"assignment to `{_text(node)}` ({target}) patches a module attribute "
                          "(monkey-patching); not allowed")
            elif not self._is_self_chain(node):
                self.flag(f".{attr}", node, f"assignment to `{_text(node)}` sets .{attr} on an object the file does "
                          "not own; kernels may set attributes only on `self` in their own classes")
            return
        if isinstance(node.ctx, ast.Load):
            if self.resolve(node) is not None:
                self.check_chain(node)
            elif not (self._is_getattr_call(self.parent(node)) and self.parent(node).args[0] is node):  # type: ignore
                self.check_value_attribute(attr, node, called=self._is_called(node))

    def check_unbound_method(self, node: ast.Attribute) -> None:
        """A method of one of the file's classes reached through the class (`Cls.method`, `type(obj).method`) can be
        called with any object as `self`, and screening lets methods read and write any attribute of `self`: that
        is a way to patch `torch.Tensor` or read a Triton function's globals. Only `self.<method>` (bound) is
        allowed; class constants and static methods stay reachable through the class."""
        value = node.value
        through_type = (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "type"
                        and not self.is_bound("type", value))
        own_class = isinstance(value, ast.Name) and value.id in self.own_classes
        if through_type:
            self.flag("type(...)", node, f"`{_text(node)}` reaches an attribute through type(...), which can call a "
                      "method with any object as self; call methods on instances")
        elif own_class and node.attr in self.own_methods:
            self.flag(f"{value.id}.{node.attr}", node, f"`{_text(node)}` takes the method {node.attr} from the class, "
                      "unbound, so any object can be passed as self; call it on an instance (`obj.method()`)")

    def check_method_decorators(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A classmethod's first parameter is the class itself, so `cls.method(obj)` is an unbound call."""
        for decorator in fn.decorator_list:
            if isinstance(decorator, ast.Name) and decorator.id == "classmethod" and not self.is_bound(
                    "classmethod", decorator):
                self.flag("classmethod", decorator, f"method {fn.name} is a classmethod, whose `cls` reaches the "
                          "class's unbound methods; use a staticmethod or an instance method")

    def _is_self_chain(self, node: ast.Attribute) -> bool:
        """`self.<...>` where `self` is the first parameter of a method of a class defined in the file."""
        root = self._chain_root(node)
        if root is None:
            return False
        parent = self.parent(root)
        while parent is not None:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*parent.args.posonlyargs, *parent.args.args]
                return (isinstance(self.parent(parent), ast.ClassDef) and bool(args) and args[0].arg == root.id
                        and root.id in self._local_names(parent) and not any(
                            isinstance(n, ast.Name) and n.id == root.id and isinstance(n.ctx, ast.Store)
                            for n in ast.walk(parent)))
            if isinstance(parent, ast.Lambda):
                return False
            parent = self.parent(parent)
        return False

    def _is_super_call(self, node: ast.AST) -> bool:
        """`super()` (not rebound): its attributes are the file's own class's bases' methods."""
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
                and not self.is_bound("super", node))

    def check_value_attribute(self, attr: str, node: ast.AST, *, called: bool) -> None:
        """An attribute of a value screening cannot type: PyTorch ops are refused by name, then only the
        allow-listed attributes pass (host: `policy.HOST_ATTRIBUTES`; device code: the language's)."""
        if self.check_method(attr, node, called=called):
            return
        if isinstance(node, ast.Attribute) and (self._is_self_chain(node) or self._is_super_call(node.value)):
            return
        if self.in_device_code(node) and self.rules.device_attributes is not None:
            allowed, where = self.rules.device_attributes(), "device-code attributes"
        else:
            allowed, where = policy.HOST_ATTRIBUTES, "attributes host code may read (tensor metadata and views, " \
                "dtype/device/finfo fields, device properties, container and string methods)"
        if attr not in allowed:
            self.flag(f".{attr}", node, f"`{_text(node)}` reads .{attr}, which is not on the allow-list of {where}; "
                      "function internals, formatting and reflection are refused")

    def _chain_root(self, node: ast.AST) -> ast.AST | None:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node if isinstance(node, ast.Name) else None

    def _is_called(self, node: ast.AST) -> bool:
        parent = self.parent(node)
        return isinstance(parent, ast.Call) and parent.func is node

    def _is_chain_interior(self, node: ast.AST) -> bool:
        parent = self.parent(node)
        return isinstance(parent, ast.Attribute) and parent.value is node

    def _is_alias_binding(self, node: ast.AST) -> bool:
        """`name = <module>` in a function or at module level (class attributes cannot be tracked as aliases)."""
        parent = self.parent(node)
        if isinstance(self.parent(parent), ast.ClassDef) if parent is not None else False:
            return False
        if isinstance(parent, ast.Assign):
            return parent.value is node and all(isinstance(t, ast.Name) for t in parent.targets)
        if isinstance(parent, (ast.AnnAssign, ast.NamedExpr)):
            return parent.value is node and isinstance(parent.target, ast.Name)
        return False

    def check_chain(self, node: ast.Name | ast.Attribute) -> None:
        """A name or attribute chain in load context: judge the whole chain once, at its outermost node."""
        if self._is_chain_interior(node):
            return
        parent = self.parent(node)
        if self._is_getattr_call(parent) and parent.args[0] is node:  # type: ignore[union-attr]
            return  # judged with the getattr call
        qualnames = self.resolve(node)
        if qualnames:
            for qualname in sorted(qualnames):
                self.check_resolved(qualname, node)
            return
        if isinstance(node, ast.Attribute):
            self.check_value_attribute(node.attr, node, called=self._is_called(node))

    def check_resolved(self, qualname: str, node: ast.AST) -> None:
        if self.is_namespace(qualname):
            if not self._is_alias_binding(node) and not self._is_hasattr_target(node):
                self.flag(qualname, node, f"`{_text(node)}` uses the module {qualname} as a value; refer to its "
                          "attributes directly (aliasing or passing modules around is not allowed)")
            else:
                self.check_namespace(qualname, node, _text(node))
            return
        self.check_reference(qualname, node, _text(node))

    def check_namespace(self, qualname: str, node: ast.AST, written: str) -> None:
        """A module bound to a name (import or alias): it must stay inside its package and be public."""
        spelled = f"`{written}`" if written == qualname else f"`{written}` ({qualname})"
        root = qualname.split(".")[0]
        if root not in self.roots:
            return  # the import itself is refused
        escaped = policy.leaves_package(qualname)
        if escaped:
            self.flag(qualname, node, f"{spelled} reaches module {escaped} through {root}; not allowed")
        elif any(p.startswith("_") and p not in policy.SAFE_DUNDERS for p in qualname.split(".")[1:]):
            self.flag(qualname, node, f"{spelled} is a private internal module; not allowed")

    def _is_hasattr_target(self, node: ast.AST) -> bool:
        parent = self.parent(node)
        return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "hasattr"
                and bool(parent.args) and parent.args[0] is node)

    def reference_problem(self, qualname: str) -> str | None:
        """Why the policy refuses a reference to `qualname` (rooted in an allowed module), or None."""
        root = qualname.split(".")[0]
        if root == "torch":
            if self.rules.torch_allowed is not None and self.rules.torch_allowed(qualname):
                return None
            return policy.torch_reference_problem(qualname, self.function_name)
        if root in self.rules.reference_rules:
            return self.rules.reference_rules[root](qualname)
        return policy.plain_module_problem(qualname)

    def check_reference(self, qualname: str, node: ast.AST, written: str) -> None:
        root = qualname.split(".")[0]
        spelled = f"`{written}`" if written == qualname else f"`{written}` ({qualname})"
        if root not in self.roots:
            problem = policy.import_problem(qualname, self.roots)
            if problem:
                self.flag(qualname, node, f"{spelled}: {problem}")
            return
        # `torch.float32.itemsize`, `torch.Tensor.relu`: past an allowed value, the rest is attribute access on
        # that value (judged like a method of an unknown object).
        parts = qualname.split(".")
        if root == "torch" and len(parts) >= 3 and parts[1] == "Tensor":
            pass  # torch.Tensor.<method> has its own rule
        else:
            for i in range(2, len(parts)):
                prefix = ".".join(parts[:i])
                if self.is_namespace(prefix):
                    continue
                if self.reference_problem(prefix) is None:
                    for j, part in enumerate(parts[i:], start=i):
                        self.check_value_attribute(part, node, called=j == len(parts) - 1 and self._is_called(node))
                    return
                break
        problem = self.reference_problem(qualname)
        if problem:
            self.flag(qualname, node, f"{spelled}: {problem}")

    def check_method(self, attr: str, node: ast.AST, *, called: bool) -> bool:
        """`<tensor>.<attr>` on an object screening cannot type: refuse PyTorch tensor ops outside device code.
        Returns whether it flagged."""
        if self.in_device_code(node):
            return False
        is_reference_op = bool(self.function_name) and attr == self.function_name
        if attr not in policy.forbidden_tensor_methods() and not is_reference_op:
            return False
        if attr in policy.CALL_ONLY_METHODS and not called:
            return False
        if attr in {"max", "min"} and isinstance(node, ast.Attribute) and self._is_finfo(node.value):
            return False
        what = "the reference op itself" if is_reference_op else "a PyTorch tensor op"
        self.flag(f".{attr}", node, f"`{_text(node)}` calls .{attr}, {what}; the kernel must compute the result "
                  "itself")
        return True

    def _is_finfo(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.finfo_names
        if isinstance(node, ast.Call):
            return bool((self.resolve(node.func) or set()) & {"torch.finfo", "torch.iinfo"})
        return False

    def check_call(self, node: ast.Call) -> None:
        if not self._is_getattr_call(node):
            if isinstance(node.func, ast.Name) and node.func.id == "getattr":
                self.flag("getattr", node, "getattr needs an object and a constant attribute name")
            return
        name = node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            self.flag("getattr", node, f"`{_text(node)}` uses getattr with a non-constant attribute name; use "
                      "attribute access with a fixed name")
            return
        attr = name.value
        if _is_dunder(attr) and attr not in policy.SAFE_DUNDERS:
            self.flag(f"getattr(..., {attr!r})", node, f"`{_text(node)}` accesses {attr}, an interpreter internal")
            return
        if attr in policy.FRAME_ATTRIBUTES or attr in policy.BANNED_ATTRIBUTES:
            self.flag(f"getattr(..., {attr!r})", node, f"`{_text(node)}` reaches {attr}; not allowed")
            return
        qualnames = self.resolve(node)
        if qualnames:
            for qualname in sorted(qualnames):
                self.check_resolved(qualname, node)
        else:
            self.check_value_attribute(attr, node, called=self._is_called(node))

    def check_string(self, node: ast.AST) -> None:
        """A string spelling a dunder name (`d["__builtins__"]`, `"__glob" + "als__"`): the key to an interpreter
        internal, refused wherever it appears (only the outermost expression that builds it is reported)."""
        parent = self.parent(node)
        if isinstance(parent, (ast.BinOp, ast.JoinedStr, ast.FormattedValue)) and _folded_string(parent) is not None:
            return
        value = _folded_string(node)
        if value is None or not _DUNDER_STRING.match(value):
            return
        if value in policy.SAFE_DUNDERS or value in policy.SAFE_DUNDER_STRINGS:
            return
        self.flag(repr(value), node, f"the string {value!r} names an interpreter internal (looking up or "
                  "subscripting dunder names is refused)")

    def check_class(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            for qualname in sorted(self.resolve(base) or ()):
                allowed = self.rules.torch_allowed is not None and self.rules.torch_allowed(qualname)
                if qualname.split(".")[0] == "torch" and not allowed:
                    self.flag(qualname, node, f"class {node.name} subclasses {qualname}; kernels must not define "
                              "tensor subclasses, modules or autograd functions")

    # -- facts --------------------------------------------------------------------------------------------
    def facts(self) -> PythonAnalysis:
        analysis = PythonAnalysis(self.tree, self.violations)
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                analysis.functions[stmt.name] = stmt
        analysis.device_functions = set(self.device_functions)
        for name, fn in analysis.functions.items():
            analysis.calls[name] = {sub.id for sub in ast.walk(fn)
                                    if isinstance(sub, ast.Name) and sub.id in analysis.functions and sub.id != name}
        return analysis


def analyse_python(source: str, rules: PythonRules, function_name: str | None = None) -> PythonAnalysis:
    """Parse and screen a Python kernel source; a syntax error gives one `kind="syntax"` violation and no facts."""
    try:
        tree = ast.parse(source, filename="<candidate>")
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        text = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
        return PythonAnalysis(None, [Violation("syntax error", int(exc.lineno or 0),
                                               f"syntax error ({where}): {exc.msg}{text}", "syntax")])
    except ValueError as exc:  # e.g. null bytes in the source
        return PythonAnalysis(None, [Violation("syntax error", 0, f"source does not parse: {exc}", "syntax")])
    analyser = _Analyser(tree, rules, function_name)
    analyser.run()
    analysis = analyser.facts()
    analysis.violations = _dedupe(analysis.violations)
    return analysis


def _dedupe(violations: list[Violation]) -> list[Violation]:
    seen: set[tuple[str, int, str]] = set()
    out: list[Violation] = []
    for v in sorted(violations, key=lambda v: (v.line, v.construct, v.message)):
        key = (v.construct, v.line, v.message)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out
