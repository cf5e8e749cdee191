"""A small collaborative test bed for proving that the algorithms learn on a CPU.

Not ColBench: a toy with ColBench's interfaces (Task, Environment, Simulator, real
sandbox scoring), small enough that a ~2M-parameter model learns it in minutes.

Its knobs and presets are testbed/bed.py's; the bed every command runs unless told
otherwise is the preset `default` (`DEFAULT_BED`): `make_tasks(split)`, `builtin:train`,
`TestbedEnv()`. `make_tasks(..., bed=NAME)` draws a preset's tasks (`bed_tasks`); each
carries `meta["bed"]` (older tasks `meta["spec"]`; testbed.bed.task_bed reads either), from
which the env and the scripted human read their rules. The exact solver of any bed is
testbed/mdp.py (values, A*, the optimal policy) and testbed/predict.py; the oracle critic
(testbed/oracle.py, `--critic oracle`) is testbed.mdp.exact_advantage.

The `legacy` preset (`builtin:legacy/<split>`) is the first bed, kept bit for bit: its
tasks are drawn here and carry no bed name. Each hides a function from one parametrised
family

    def f(x):
        if x >= 0:
            return x * A        # A in {2, 3}, told only when asked about positive numbers
        return x + B            # B in {10, 20}, told only when asked about negative numbers

The description is vague ("treats positive and negative numbers differently"). The
scripted human (testbed/human.py) answers a question about positive numbers
with A and one about negative numbers with B, and "I don't know" otherwise. Five of
the ten hidden tests use positive inputs and five negative ones, so an agent that
asks one question and guesses the other constant earns about half the reward, and
only an agent that asks both questions and copies both numbers into its code earns
full reward: multi-turn credit assignment in miniature.

A and B are single tokens from two disjoint two-value sets, so using a stated
constant is a small lookup, not a copy that a 2M-parameter model needs thousands of
steps to learn. The scripted explorer the warm start imitates (testbed/human.py)
chooses per turn between asking about positive numbers, negative numbers, a vague
question and answering now, and writes a never-right default (x * 1, x + 0) for any
constant it was not told: success comes only from asking both useful questions.
"""

from __future__ import annotations

import random
import re
import warnings
from typing import Sequence

from colbench.envs.backend import BackendEnv
from colbench.envs.base import agent_chat
from colbench.protocols import ANSWER_MARKER
from colbench.scoring.backend import extract_code
from colbench.types import Task, Turn
from engines.base import Message
from testbed import bed as testbed_bed
from testbed.bed import DEFAULT_BED, LEGACY_GUESS, PRESETS, SYSTEM, BedDesign

DESCRIPTION = "I need a function f(x) for my numbers. It treats positive and negative numbers differently. def f(x)"
QUESTION_POS, QUESTION_NEG, QUESTION_VAGUE = PRESETS["legacy"].questions()  # "What happens to positive numbers?", ...

# Two values per constant: the 2M-parameter warm start learned to copy which of 8 stated
# values it was told only at chance after 400 steps (it learned *that* it was told), so
# the lookup is kept small and the difficulty stays in which questions to ask.
A_VALUES = (2, 3)
B_VALUES = (10, 20)
N_TRAIN, N_TEST = 56, 16
DEFAULT_A, DEFAULT_B = LEGACY_GUESS  # the explorer's guess for a constant it was not told: never right
MAX_TURNS = 4  # agent turns: up to three questions, then the answer
REFERENCE = "def f(x):\n    if x >= 0:\n        return x * {a}\n    return x + {b}\n"


def answer_text(a: int, b: int) -> str:
    """The agent's final message for constants (a, b), in the canonical form."""
    return f"{ANSWER_MARKER}\n```python\n{REFERENCE.format(a=a, b=b)}```"


def make_task(index: int, split: str, a: int, b: int, rng: random.Random) -> Task:
    pos = rng.sample(range(1, 10), 5)
    neg = rng.sample(range(-9, 0), 5)
    tests = tuple(f"f({x})" for x in pos + neg)
    return Task(
        task_id=f"testbed-{split}-{index:04d}",
        env="testbed",
        description=DESCRIPTION,
        hidden=REFERENCE.format(a=a, b=b),
        tests=tests,
        meta={"a": a, "b": b, "split": split},
    )


def make_tasks(split: str = "train", n: int | None = None, seed: int = 0,
               bed: str | BedDesign = DEFAULT_BED) -> list[Task]:
    """Deterministic task sets of a preset (default: `DEFAULT_BED`; `bed_tasks`).
    Legacy: 56 train and 16 test tasks cycling through the four (A, B) pairs, each with
    its own hidden test inputs. The description is the same for every task, so a task's
    constants are learnable only by asking, never by memorising."""
    s = testbed_bed.design(bed)
    if not s.legacy and split in ("train", "val", "test"):
        return bed_tasks(s, split, n, seed)
    sizes = {"train": N_TRAIN, "test": N_TEST}
    if split not in sizes:
        raise ValueError(f"testbed split must be 'train' or 'test'{'' if s.legacy else ' or val'}, got {split!r}")
    combos = [(a, b) for a in A_VALUES for b in B_VALUES]
    rng = random.Random(f"{split}-{seed}")
    tasks = [make_task(i, split, *combos[i % len(combos)], rng) for i in range(sizes[split])]
    return tasks[:n] if n is not None else tasks


def builtin_tasks(source: str, split: str | None = None, limit: int | None = None) -> list[Task]:
    """The tasks of a test-bed source, builtin:<split> or builtin:<bed>/<split>: the
    registered generated source of colbench.tasks.load_tasks (GENERATED_SOURCES)."""
    bed, named = builtin_source(source, split)
    return make_tasks(named, n=limit, bed=bed)


def builtin_source(source: str, split: str | None) -> tuple[str, str]:
    """(bed, split) of a test-bed source: builtin:<split> (`DEFAULT_BED`) or
    builtin:<bed>/<split>; a bad bed or split is a one-line error naming the presets."""
    body = source.partition(":")[2]
    bed, _, named = body.rpartition("/")
    bed, named = bed or DEFAULT_BED, named or split or ""
    usage = f"use builtin:train, builtin:test or builtin:<bed>/<split> with bed one of {', '.join(PRESETS)}"
    if bed not in PRESETS:
        raise ValueError(f"testbed source {source!r}: unknown bed {bed!r}; {usage}")
    if named not in ("train", "test") and not (named == "val" and bed != "legacy"):
        raise ValueError(f"testbed source {source!r}: split must be 'train', 'test' (or 'val', of a bed other "
                         f"than legacy), got {named!r}; {usage}")
    if split is not None and split != named:
        raise ValueError(f"source {source!r} conflicts with split={split!r}")
    return bed, named


def bed_tasks(s: BedDesign, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
    """A non-legacy bed's tasks: each an independent draw of c (testbed.bed.draw_hidden),
    rendered as its reference, with five hidden test inputs per branch. Train and test
    use different random streams, so the held-out tasks are fresh draws. Validation
    tasks ("val") are the train stream's next n_val draws after its n_train tasks:
    drawn from the train split, disjoint from the tasks trained on."""
    size = {"train": s.n_train, "val": s.n_val, "test": s.n_test}[split]
    first = s.n_train if split == "val" else 0
    rng = random.Random(f"testbed-{s.name}-{'train' if split == 'val' else split}-{seed}")
    tasks = []
    for i in range(first + (size if n is None else min(n, size))):
        hidden = testbed_bed.draw_hidden(s, rng)
        inputs = [x for f in s.fact_list for x in rng.sample(f.inputs, testbed_bed.TESTS_PER_FACT)]
        if i < first:
            continue
        tasks.append(Task(task_id=f"testbed-{s.name}-{'train' if split == 'val' else split}-{i:04d}", env="testbed",
                          description=testbed_bed.description(s), hidden=testbed_bed.reference_source(s, hidden),
                          tests=tuple(f"f({x})" for x in inputs), meta={testbed_bed.BED_KEY: s.name, "split": split}))
    return tasks


# ---- the legacy bed's answer readers (the warm start's copy check) ----------------------------

_STATED_A = re.compile(r"\bx\s*\*\s*(-?\d+)")
_STATED_B = re.compile(r"\bx\s*\+\s*(-?\d+)")


def _code_constants(code: str) -> tuple[int | None, int | None]:
    """(A, B) of a function written in the reference's form: the first `x * <n>` and the
    first `x + <n>`; None for a side that is missing, both None when the code does not
    compile (the sandbox would fail every test)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning on odd literals: not our concern
            compile(code, "<answer>", "exec")  # syntax check only: nothing runs
    except (SyntaxError, ValueError):
        return None, None
    a, b = _STATED_A.search(code), _STATED_B.search(code)
    return (int(a.group(1)) if a else None), (int(b.group(1)) if b else None)


def answer_constants(text: str) -> tuple[int | None, int | None]:
    """(A, B) that an agent's final message writes (None: a side it does not write, or
    code that does not compile). The code is read as the runner reads it
    (BackendEnv.extract_answer: after the answer marker, else the whole message), and
    parsed, not run."""
    _, found, after = text.partition(ANSWER_MARKER)
    return _code_constants(extract_code(after if found and after.strip() else text))


def told_constants(replies: Sequence[str], a: int, b: int) -> tuple[bool, bool]:
    """Whether the human's replies so far stated A (`x * A`) and B (`x + B`) of a task
    with constants (a, b): what the agent has been told."""
    return (any(re.search(rf"x \* {a}\b", r) for r in replies),
            any(re.search(rf"x \+ {b}\b", r) for r in replies))


class TestbedEnv(BackendEnv):
    """Backend programming's environment (sandboxed scoring, answer marker) with the
    test bed's short instructions and the turn limit of its bed.

    bed:  a preset name (default `DEFAULT_BED`); the turn limit is the bed's unless
          `max_turns` is given (or set later). A task carrying another turn count than the
          env's limit is refused: its bed would silently change. A legacy task (no bed name:
          `builtin:legacy/<split>`) runs at any limit chosen for it (`bed="legacy"`,
          `max_turns`, or set later) and is refused at the default bed's limit."""

    name = "testbed"
    __test__ = False  # not a pytest class

    def __init__(self, max_turns: int | None = None, answer_marker: str = ANSWER_MARKER, workers: int = 2,
                 limits=None, bed: str | None = None):
        self.design = testbed_bed.design(bed if bed is not None else DEFAULT_BED)
        super().__init__(answer_marker=answer_marker, max_turns=self.design.turns if max_turns is None else max_turns,
                         workers=workers, limits=limits)
        self.turns_chosen = max_turns is not None or bed is not None  # the setter marks later changes
        self.agent_prompt = None  # its instructions are SYSTEM, not a template file (colbench.prompts)

    @property
    def max_turns(self) -> int:
        return self._max_turns

    @max_turns.setter
    def max_turns(self, value: int) -> None:
        self._max_turns, self.turns_chosen = value, True

    @staticmethod
    def turns_for(tasks: Sequence[Task]) -> int | None:
        """The agent-turn limit the tasks' bed sets (legacy tasks, which carry no bed name: the
        legacy bed's 4; None for no tasks); beds with different turn counts, or legacy tasks
        beside other beds' tasks, cannot share one env (ValueError)."""
        turns = {testbed_bed.task_design(t).turns for t in tasks}
        named = {testbed_bed.task_bed(t) is not None for t in tasks}
        if not turns:
            return None
        if len(turns) > 1 or len(named) > 1:
            raise ValueError("the tasks mix test beds with different turn limits: evaluate them apart")
        return turns.pop()

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        if not single_turn:
            s = testbed_bed.task_design(task)
            named = testbed_bed.task_bed(task) is not None
            if named and s.turns != self.max_turns:
                raise ValueError(f"task {task.task_id} is of test bed {s.name!r} ({s.turns} agent turns) but "
                                 f"the env allows {self.max_turns}: use TestbedEnv(bed={s.name!r}) or --max-turns "
                                 f"{s.turns}")
            if not named and not self.turns_chosen:
                raise ValueError(f"task {task.task_id} is of the legacy test bed ({s.turns} agent turns) but the env "
                                 f"has the {self.design.name!r} bed's limit ({self.max_turns}): use "
                                 f"TestbedEnv(bed='legacy') or --max-turns {s.turns}")
        system = SYSTEM if not single_turn else f"Write {self.answer_marker} and the code now."
        return agent_chat(system, task.description, turns)
