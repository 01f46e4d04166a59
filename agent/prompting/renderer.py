"""`PromptRenderer`: renders the agent's Jinja prompts for a task, with user overrides by file name.

Templates come from `prompts/` (the package); a user folder given as `prompts_dir` replaces any template (or the
example files `triton_example.py`, `module_example.py`, `module_example_reference.py`) with a file of the same
name and falls back to the built-ins for the rest. Language-specific text lives with each language
(`KernelLanguage.prompt_fragments()`: Triton's in `prompts/triton/`, CUDA's in `agent/languages/cuda/prompts/`):
the built-in templates include it as `lang/<fragment>.j2`, and an override folder may replace it in a subfolder
named after the language (`<prompts_dir>/cuda/rules.j2`). Rendering is strict (`StrictUndefined`): a template
that uses a variable the renderer does not provide fails with an error naming the template file and line.
`template_hash(language)` is a stable sha256 over every template and example one language uses, for kernel-cache
keys. The renderer has no default language: each task names its own (`KernelTask.language`...).
"""

from __future__ import annotations

import hashlib
import logging
import re
import traceback
from pathlib import Path
from typing import Any

import jinja2

from agent.examples import EXAMPLES_DIR
from agent.languages import get_language
from agent.prompting.context import instance_task_context, kernel_task_context, module_task_context
from agent.prompting.task import InstanceTask, KernelTask, ModuleTask
from agent.prompting.views import Failure, Performance
from forge.errors import KernelForgeError
from prompts import PROMPTS_DIR

__all__ = ["EXAMPLES_DIR", "PROMPT_FORMAT_VERSION", "PromptRenderer", "PromptTemplateError"]

logger = logging.getLogger(__name__)

# Bump when the Python side changes what the templates receive (part of template_hash).
PROMPT_FORMAT_VERSION = "1"
EXAMPLE_FILES = ("triton_example.py", "module_example.py", "module_example_reference.py")
TEMPLATE_SUFFIX = ".j2"


class PromptTemplateError(KernelForgeError, ValueError):
    """A template failed to load or render (unknown variable, syntax error, missing include)."""


def fenced(code: str, language: str = "python") -> str:
    """`code` in a markdown fence that its own content cannot close."""
    longest = max((len(m) for m in re.findall(r"`{3,}", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{code.rstrip()}\n{fence}"


def _tidy(text: str) -> str:
    """Strip trailing spaces and squeeze blank-line runs, except inside fenced code (kept verbatim)."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        marker = re.match(r"^(`{3,}|~{3,})", stripped)
        if fence is None:
            if marker:
                fence = marker.group(1)
            line = line.rstrip()
            if not line and out and not out[-1]:
                continue
        elif marker and stripped == marker.group(1) and marker.group(1).startswith(fence):
            fence = None
        out.append(line)
    return "\n".join(out).strip() + "\n"


class PromptRenderer:
    """Renders the system, generate, fix and optimize prompts (and their module-problem variants: generate_module,
    fix_module, optimize_module)."""

    def __init__(self, prompts_dir: str | Path | None = None) -> None:
        self.builtin_dir = Path(PROMPTS_DIR)
        self.prompts_dir = Path(prompts_dir).expanduser().resolve() if prompts_dir is not None else None
        if self.prompts_dir is not None and not self.prompts_dir.is_dir():
            raise ValueError(
                f"prompt override folder {self.prompts_dir} does not exist; pass a folder holding *.j2 templates "
                "named like the built-ins (system.j2, generate.j2, fix.j2, optimize.j2, ...) or None"
            )
        self._envs: dict[str, jinja2.Environment] = {}  # one per kernel language, made on first use
        if self.prompts_dir is not None:
            overrides = sorted(p.name for p in self.prompts_dir.iterdir() if p.is_file())
            logger.debug("prompt overrides from %s: %s", self.prompts_dir, overrides)

    def _environment(self, language: str) -> jinja2.Environment:
        """The Jinja environment for one kernel language: templates from the override folder, then the built-ins;
        `lang/<name>` resolves to `<override folder>/<language>/<name>`, then the language's own fragment folder."""
        env = self._envs.get(language)
        if env is not None:
            return env
        fragments = get_language(language).prompt_fragments()
        search = [str(self.prompts_dir)] if self.prompts_dir is not None else []
        search.append(str(self.builtin_dir))
        language_dirs = [str(self.prompts_dir / language)] if self.prompts_dir is not None else []
        language_dirs.append(str(fragments.template_dir))
        env = jinja2.Environment(
            loader=jinja2.ChoiceLoader([
                jinja2.PrefixLoader({"lang": jinja2.FileSystemLoader(language_dirs)}),
                jinja2.FileSystemLoader(search),
            ]),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        env.filters["fenced"] = fenced
        env.globals["kernel_noun"] = fragments.kernel_noun
        self._envs[language] = env
        return env

    # -- files --------------------------------------------------------------------------------------------
    def template_names(self, language: str) -> list[str]:
        """Every template name available for `language` (built-ins, overrides and its `lang/` fragments), sorted."""
        return sorted(n for n in self._environment(language).list_templates() if n.endswith(TEMPLATE_SUFFIX))

    def template_path(self, name: str, language: str) -> Path:
        """The file a template name resolves to (the override if there is one)."""
        source = self._environment(language).loader.get_source(self._environment(language), name) \
            if name in self.template_names(language) else None
        if source is None or source[1] is None:
            raise PromptTemplateError(f"no prompt template named {name!r} (known: "
                                      f"{', '.join(self.template_names(language))})")
        return Path(source[1])

    def example_path(self, name: str, language: str | None = None) -> Path:
        """The example file in use: an override of the same name in `prompts_dir`, else `language`'s example (for
        its own example's name) or agent/examples/<name>. `language` None: a file no language owns (the module
        examples)."""
        if self.prompts_dir is not None and (self.prompts_dir / name).is_file():
            return self.prompts_dir / name
        own = get_language(language).prompt_fragments().example_file if language is not None else None
        return own if own is not None and own.name == name else EXAMPLES_DIR / name

    def example(self, name: str, language: str | None = None) -> dict[str, str]:
        path = self.example_path(name, language)
        return {"name": name, "code": path.read_text(encoding="utf-8").rstrip() + "\n"}

    def template_hash(self, language: str) -> str:
        """sha256 over the prompt format version, every template in use for `language` (its fragments included)
        and the example files (stable)."""
        digest = hashlib.sha256(f"kernel-forge prompts v{PROMPT_FORMAT_VERSION}\0".encode())
        for name in self.template_names(language):
            digest.update(f"template {name}\0".encode())
            digest.update(self.template_path(name, language).read_bytes())
            digest.update(b"\0")
        examples = (get_language(language).prompt_fragments().example_file.name, *EXAMPLE_FILES[1:])
        for name in examples:
            digest.update(f"example {name}\0".encode())
            digest.update(self.example_path(name, language).read_bytes())
            digest.update(b"\0")
        return digest.hexdigest()

    # -- rendering ----------------------------------------------------------------------------------------
    def render(self, template_name: str, **context: Any) -> str:
        """Render one template with `context` (its `task["language"]`, which every task context holds, picks the
        language's fragments); errors name the template file (and line) at fault."""
        task = context.get("task")
        language = task.get("language") if isinstance(task, dict) else None
        if not language:
            raise PromptTemplateError(f"cannot render {template_name!r}: its context has no task['language'] (build "
                                      "it with kernel_task_context / module_task_context / instance_task_context)")
        try:
            template = self._environment(language).get_template(template_name)
            return _tidy(template.render(**context))
        except jinja2.TemplateSyntaxError as exc:
            where = f"{exc.filename or exc.name}:{exc.lineno}"
            raise PromptTemplateError(f"prompt template {where} has a syntax error: {exc.message}") from exc
        except jinja2.TemplateNotFound as exc:
            raise PromptTemplateError(
                f"prompt template {exc.name!r} (needed to render {template_name!r}) was not found in "
                f"{self.prompts_dir or ''} {self.builtin_dir}".replace("  ", " ")
            ) from exc
        except jinja2.UndefinedError as exc:
            raise PromptTemplateError(
                f"prompt template {_template_frame(exc) or template_name} uses an undefined variable: {exc.message}; "
                f"variables available to {template_name!r}: {', '.join(sorted(context))} (see prompts/README.md)"
            ) from exc
        except jinja2.TemplateError as exc:
            raise PromptTemplateError(
                f"prompt template {_template_frame(exc) or template_name} failed: {exc}"
            ) from exc

    def _function_context(self, task: KernelTask) -> dict[str, Any]:
        if not isinstance(task, KernelTask):
            raise TypeError(f"expected a KernelTask, got {type(task).__name__}; use generate_module for ModuleTask")
        example = get_language(task.language).prompt_fragments().example_file.name
        return {**kernel_task_context(task), "example": self.example(example, task.language)}

    def _module_context(self, task: ModuleTask) -> dict[str, Any]:
        if not isinstance(task, ModuleTask):
            raise TypeError(f"expected a ModuleTask, got {type(task).__name__}")
        return {
            **module_task_context(task),
            "example": self.example("module_example.py"),
            "example_reference": self.example("module_example_reference.py"),
        }

    def _instance_context(self, task: InstanceTask) -> dict[str, Any]:
        if not isinstance(task, InstanceTask):
            raise TypeError(f"expected an InstanceTask, got {type(task).__name__}")
        return instance_task_context(task)

    def system(self, task: KernelTask | ModuleTask | InstanceTask) -> str:
        """The system message: role, language and hard rules."""
        if isinstance(task, ModuleTask):
            return self.render("system.j2", **module_task_context(task))
        if isinstance(task, InstanceTask):
            return self.render("system.j2", **self._instance_context(task))
        return self.render("system.j2", **self._function_context(task))

    def generate(self, task: KernelTask) -> str:
        """First user message: the function, every sampled call, the device, the rules and an example file."""
        return self.render("generate.j2", **self._function_context(task))

    def fix(self, task: KernelTask, previous_code: str | None, failure: Any) -> str:
        """Follow-up after a failed attempt: the previous code and the structured failure (see `Failure.of`)."""
        view = Failure.of(failure, previous_code=previous_code)
        return self.render(
            "fix.j2",
            **self._function_context(task),
            previous_code=previous_code,
            failure=view.template_context(language=task.language),
        )

    def optimize(self, task: KernelTask, code: str, performance: Any) -> str:
        """Follow-up for a correct kernel: measured speed vs PyTorch, roofline and launch cost; ask for faster."""
        perf = Performance.of(performance)
        return self.render(
            "optimize.j2",
            **self._function_context(task),
            code=code,
            performance=perf.template_context(calls=len(task.samples), language=task.language),
        )

    def generate_module(self, task: ModuleTask) -> str:
        """First user message for a KernelBench-format problem: write `ModelNew`."""
        return self.render("generate_module.j2", **self._module_context(task))

    def optimize_module(self, task: ModuleTask, code: str, performance: Any) -> str:
        """Follow-up for a correct `ModelNew`: its measured forward time vs the reference `Model` (one pass on
        `get_inputs()`, the same Performance block as `optimize`); ask for a faster file."""
        perf = Performance.of(performance)
        return self.render(
            "optimize_module.j2",
            **self._module_context(task),
            code=code,
            performance=perf.template_context(calls=1, language=task.language),
        )

    def fix_module(self, task: ModuleTask, previous_code: str | None, failure: Any) -> str:
        """Follow-up after a failed `ModelNew` attempt."""
        view = Failure.of(failure, previous_code=previous_code)
        return self.render(
            "fix_module.j2",
            **self._module_context(task),
            previous_code=previous_code,
            failure=view.template_context(language=task.language),
        )

    def generate_instance(self, task: InstanceTask) -> str:
        """First user message for a hot module of a real model: its forward, helpers, attributes, parameters and
        sampled calls; write `ModelNew(original)`."""
        return self.render("generate_instance.j2", **self._instance_context(task))

    def fix_instance(self, task: InstanceTask, previous_code: str | None, failure: Any) -> str:
        """Follow-up after a failed `ModelNew(original)` attempt."""
        view = Failure.of(failure, previous_code=previous_code)
        return self.render("fix_instance.j2", **self._instance_context(task), previous_code=previous_code,
                           failure=view.template_context(language=task.language))

    def optimize_instance(self, task: InstanceTask, code: str, performance: Any) -> str:
        """Follow-up for a correct `ModelNew(original)`: its time on the model's calls vs the original forward."""
        perf = Performance.of(performance)
        return self.render("optimize_instance.j2", **self._instance_context(task), code=code,
                           performance=perf.template_context(calls=len(task.samples), language=task.language))


def _template_frame(exc: BaseException) -> str | None:
    """`file.j2:line` of the innermost template frame in the exception's traceback."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.endswith(TEMPLATE_SUFFIX):
            found = f"{frame.filename}:{frame.lineno}"
    return found
