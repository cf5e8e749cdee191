"""Print, as JSON, the parts of the installed `appworld` package that colbench's AppWorld
adapter relies on. Runs in AppWorld's own venv (never ours):

    /work/appworld-venv/bin/python tests/colbench/appworld_probe.py > tests/fixtures/appworld_interface.json

Reads the package's objects by inspection; needs no task data and starts no server.
"""

import inspect
import json
from importlib.metadata import version


def routes() -> dict:
    from fastapi.routing import APIRoute

    from appworld.serve.environment import app

    out = {}
    for r in app.routes:
        if not isinstance(r, APIRoute):
            continue
        fields = {}
        body = r.dependant.body_params
        model = getattr(body[0], "type_", None) if len(body) == 1 else None
        if inspect.isclass(model) and hasattr(model, "__fields__"):  # a pydantic model body (/initialize)
            fields.update({k: bool(f.required) for k, f in model.__fields__.items()})
            layout = "model"  # the JSON body is the model's fields
        elif len(body) == 1 and not getattr(body[0].field_info, "embed", False):
            raise SystemExit(f"{r.path}: a bare (non-embedded) JSON body; the adapter sends objects")
        else:
            layout = "object" if body else "none"  # embedded: {"name": value, ...}
            fields.update({p.name: bool(p.required) for p in body})
        for p in r.dependant.path_params + r.dependant.query_params:
            fields[p.name] = bool(p.required)
        out[r.path] = {"methods": sorted(r.methods), "body": layout, "fields": dict(sorted(fields.items()))}
    return dict(sorted(out.items()))


def task_record_keys() -> dict:
    """The keys of the task record that /initialize and GET /tasks/{id} answer with (their
    `output = {...}` literals in the server's source), nested dicts as {key: [subkeys]}."""
    import ast

    import appworld.serve.environment as server

    def keys(node: ast.Dict) -> dict:
        return {k.value: sorted(keys(v)) if isinstance(v, ast.Dict) else None for k, v in zip(node.keys, node.values)}

    out = {}
    for fn in ast.walk(ast.parse(inspect.getsource(server))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in ("initialize", "show_task"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "output" \
                        and isinstance(node.value, ast.Dict):
                    out[fn.name] = keys(node.value)
    return out


def main() -> None:
    from appworld.cli import ServerType
    from appworld.environment import AppWorld
    from appworld.evaluator import TestTracker
    from appworld.task import task_id_to_generator_id

    source = inspect.getsource(TestTracker.to_dict)
    tracker_keys = [k for k in ("success", "difficulty", "num_tests", "passes", "failures") if f'"{k}"' in source]
    print(json.dumps({
        "appworld_version": version("appworld"),
        "server_module": "appworld.serve.environment",
        "server_types": sorted(t.value for t in ServerType),
        "routes": routes(),
        "task_record": task_record_keys(),
        "appworld_init": [p for p in inspect.signature(AppWorld.__init__).parameters if p != "self"],
        "evaluate_output_keys": tracker_keys,
        # a world's outputs (its saved databases, which /evaluate reads) are kept per experiment and task
        "world_outputs_per_experiment_and_task": 'os.path.join(output_directory, "tasks", task_id)'
        in inspect.getsource(AppWorld.__init__),
        "scenario_ids": {t: task_id_to_generator_id(t) for t in ("82e2fac_1", "692c77d_2", "50e1ac9_10")},
    }, indent=1))


if __name__ == "__main__":
    main()
