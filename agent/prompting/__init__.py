"""Prompts of the LLM kernel agent: tasks, failure/performance views, and the Jinja renderer.

    from agent.prompting import KernelTask, PromptRenderer
    task = KernelTask.from_samples("rms_norm", counter.items(), language="triton")
    renderer = PromptRenderer()                 # or PromptRenderer("my_prompts/") to override templates by name
    messages = [{"role": "system", "content": renderer.system(task)},
                {"role": "user", "content": renderer.generate(task)}]
"""

from agent.prompting.context import describe_value, kernel_task_context, module_task_context
from agent.prompting.renderer import EXAMPLES_DIR, PROMPT_FORMAT_VERSION, PromptRenderer, PromptTemplateError, fenced
from agent.prompting.task import InstanceTask, KernelTask, ModuleTask, SampleEntry
from agent.prompting.views import Failure, Performance, ViolationView, excerpt, format_time_ms, worst_mismatches

__all__ = [
    "EXAMPLES_DIR",
    "PROMPT_FORMAT_VERSION",
    "Failure",
    "KernelTask",
    "InstanceTask",
    "ModuleTask",
    "Performance",
    "PromptRenderer",
    "PromptTemplateError",
    "SampleEntry",
    "ViolationView",
    "describe_value",
    "excerpt",
    "fenced",
    "format_time_ms",
    "kernel_task_context",
    "module_task_context",
    "worst_mismatches",
]
