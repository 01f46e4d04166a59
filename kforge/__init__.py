"""The application layer: the `kforge` command, which composes the library (`forge`), the LLM kernel generator
(`agent`) and the evals (`evals`).

Why a layer of its own: `forge` is the library a model is optimised with (profile, oracle, optimizer, plan, runtime)
and knows nothing of `agent` or `evals`; the generator and the evals build on `forge`; only this package sees all
three (`tests/test_layers.py` fails when an import crosses a layer the wrong way).
"""
