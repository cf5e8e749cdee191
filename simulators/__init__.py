"""Simulated humans and their registry.

Simulator spec strings (the `--simulator` flag of `python -m colbench.evaluate`):

    scripted:<name>       a registered rule-based simulator (scripted:backend,
                          scripted:idk, scripted:flaky: simulators.scripted;
                          scripted:appworld: runs the agent's code in AppWorld,
                          colbench.envs.appworld;
                          scripted:testbed: the test bed's human, testbed.human)
    <model spec>          backend: an LLM simulated human (simulators.llm.LLMSimulator);
                          frontend: a vision-language model comparing screenshots
                          (simulators.vlm.VLMSimulator)
    text+<model spec>     frontend only: a text-only model reading both pages' HTML
                          instead of screenshots (simulators.text_frontend)

Plug in your own (called as `Class(env=env, max_reply_chars=N)`):

    from simulators import register_simulator
    register_simulator("mine", "mypkg.sims:MySimulator")    # then --simulator scripted:mine

Entries are "module:Class" strings imported on use (colbench.registry): scripted:testbed
is the lab's (testbed/human.py), which simulators does not import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from colbench.prompts import PromptError, human_kind, load_prompt
from engines.base import SamplingParams, SpecError
from simulators.base import SimReply, SimRequest, Simulator

if TYPE_CHECKING:
    from colbench.protocols import Environment
    from engines.base import EngineOptions

__all__ = ["SimReply", "SimRequest", "Simulator", "check_simulator_spec", "load_simulator",
           "register_simulator", "simulator_names"]

_REGISTRY: dict[str, str] = {
    "appworld": "colbench.envs.appworld:AppWorldExecutor",
    "backend": "simulators.scripted:ScriptedBackendSimulator",
    "idk": "simulators.scripted:DontKnowSimulator",
    "flaky": "simulators.scripted:FlakySimulator",
    "testbed": "testbed.human:TestbedSimulator",
}


def register_simulator(name: str, target: str) -> None:
    """Register a simulator class under `scripted:<name>`; target is "module:Class"."""
    if ":" not in target:
        raise ValueError(f"register_simulator({name!r}, {target!r}): target must be 'module:Class'")
    _REGISTRY[name] = target


def simulator_names() -> list[str]:
    return sorted(_REGISTRY)


def check_simulator_spec(spec: str | None, env_name: str) -> None:
    """Validate a simulator spec without loading any model; raise SpecError (one line)."""
    if spec is None:
        return
    spec = spec.strip()
    if spec.startswith("scripted:"):
        name = spec[len("scripted:"):]
        if name not in _REGISTRY:
            raise SpecError(f"unknown simulator {spec!r}; known: "
                            + ", ".join(f"scripted:{n}" for n in simulator_names()))
        return
    from engines import check_spec

    if spec.startswith("text+"):
        if env_name != "frontend":
            raise SpecError(f"simulator {spec!r}: the 'text+' prefix is for the frontend env only")
        spec = spec[len("text+"):]
    if env_name not in ("backend", "frontend"):
        raise SpecError(f"no model simulator for env {env_name!r}; use scripted:<name>")
    check_spec(spec)


def load_simulator(spec: str | None, env: "Environment", *, engine_options: "EngineOptions | None" = None,
                   max_reply_chars: int | None = None, max_new_tokens: int | None = None,
                   prompt_file: str | None = None) -> Simulator | None:
    """Build the simulator a spec names (None -> None). Model specs load an engine.
    `max_reply_chars`: the reply cap (--max_reply_chars; None: the environment's,
    colbench.envs.reply_cap: frontend 1,000, backend 400, as published).
    `max_new_tokens` sets a model simulator's reply budget (default: the simulator's).
    `prompt_file`: a model simulator's template (the `--human_prompt` flag; None: ours;
    kinds backend_human / frontend_vlm / frontend_text of colbench.prompts), validated
    before any engine loads; a scripted simulator reads none (PromptError if given)."""
    check_simulator_spec(spec, env.name)
    if spec is None:
        if prompt_file:
            raise PromptError(f"--human_prompt {prompt_file}: no simulator to read it")
        return None
    spec = spec.strip()
    kind = human_kind(env.name, spec)
    if prompt_file and kind is None:
        raise PromptError(f"--human_prompt {prompt_file}: simulator {spec!r} reads no prompt file (only model "
                          "simulators do)")
    if kind is not None:
        load_prompt(kind, prompt_file)  # a bad file fails here, before the engine loads
        kwargs_prompt = {"prompt_file": prompt_file or None}
    from colbench.envs import reply_cap

    max_reply_chars = reply_cap(env, max_reply_chars)
    if spec.startswith("scripted:"):
        from colbench.registry import load_target

        return load_target(_REGISTRY[spec[len("scripted:"):]])(env=env, max_reply_chars=max_reply_chars)
    from engines import load_engine

    # Greedy replies, as in the paper; only the length budget is configurable here.
    kwargs = {"sampling": SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)} if max_new_tokens else {}
    if env.name == "backend":
        from simulators.llm import LLMSimulator

        return LLMSimulator(load_engine(spec, engine_options), max_reply_chars=max_reply_chars, **kwargs, **kwargs_prompt)
    renderer = env.renderer  # type: ignore[attr-defined]  # FrontendEnv's RenderPool
    if spec.startswith("text+"):
        from simulators.text_frontend import TextFrontendSimulator

        engine = load_engine(spec[len("text+"):], engine_options)
        return TextFrontendSimulator(engine, renderer, max_reply_chars=max_reply_chars, **kwargs, **kwargs_prompt)
    from simulators.vlm import VLMSimulator

    return VLMSimulator(load_engine(spec, engine_options), renderer, max_reply_chars=max_reply_chars, **kwargs,
                        **kwargs_prompt)
