"""The test bed's knobs: a `BedDesign` and its presets, and the rules every part reads.

A bed's design says how many hidden facts (branch constants) a task has, how many agent turns
there are, how often the human can state a constant, how often the reference has a
docstring, what an untold constant is guessed as, and how the warm start's scripted
explorer behaves. Presets by name (`design(name)`, `PRESETS`), called beds:

    default   the bed every command runs unless told otherwise (`DEFAULT_BED`;
              `builtin:train`, the main job), whose luck lives in c: 2 facts, 3 turns (no spare),
              each constant stated with p 0.75 (else an expression: "not sure"), a
              docstring with p 0.35 (the vague question then reads out both), one side
              per message, the untold guess right on half of the tasks, explorer p_ask 0.75
    long      3 facts, 5 turns (one spare): the horizon on which the exact solver
              (testbed.predict) puts per-turn DPO with the exact critic above
              trajectory DPO
    legacy    the first bed, kept bit for bit (testbed/env.py's tasks; `builtin:legacy/<split>`):
              2 facts, 4 turns, every constant stated, no docstring, defaults never right

Everything the human does is decided by the task's hidden reference (c), and only by it:
the reference's source shows whether a branch's constant is a literal (the human states
it) or an expression (the human is "not sure"), and whether it has a docstring (read out
for the vague question). `human_reply(design, reference, question)` is a deterministic
function of (reference, question); for a policy that does not see c the human is random,
for a critic that sees c it is not. Held-out test tasks are fresh draws from the bed.

`explorer_probs(design, history)` is the scripted explorer (the warm start's teacher, the
exact solver's π0, `--agent explorer`): the one definition of its behaviour.
"""

from __future__ import annotations

import ast
import random
import re
import warnings
from dataclasses import dataclass, fields, replace
from typing import Sequence

from colbench.protocols import ANSWER_MARKER
from colbench.scoring.backend import extract_code

DEFAULT_BED = "default"
"""The preset every command runs unless told otherwise: what `builtin:train` / `builtin:test`,
`make_tasks`, `TestbedEnv()`, the warm start, the oracle and the main job
(`python -m testbed.demo`) mean. The other presets are `builtin:<bed>/<split>` and `--bed`."""


@dataclass(frozen=True)
class Fact:
    """One hidden constant: a branch of f, the word that asks about it, and its values.

    word:   the keyword a question names it by ("positive"); the human's reply names it too.
    op:     the operator of the branch's return, `x <op> K` ("*", "+", ...).
    values: the two values K takes; the guess for an untold K is values[0].
    inputs: the test inputs of this branch (five are drawn per task).
    """

    word: str
    op: str
    values: tuple[int, int]
    inputs: tuple[int, ...]


# In fact order: a bed with n facts uses the first n. "positive"/"negative" are the
# legacy bed's two branches (its wording and constants), so the default bed reads alike.
FACTS = (
    Fact("positive", "*", (2, 3), tuple(range(1, 10))),
    Fact("negative", "+", (10, 20), tuple(range(-9, 0))),
    Fact("large", "-", (4, 5), tuple(range(10, 100))),
    Fact("huge", "//", (2, 4), tuple(range(100, 1000))),
)
_OPS = {ast.Mult: "*", ast.Add: "+", ast.Sub: "-", ast.FloorDiv: "//"}
TESTS_PER_FACT = 5

DONT_KNOW = "I don't know."
QUESTION_VAGUE = "Can you tell me more?"
SYSTEM = "Ask the human about f, then write " + ANSWER_MARKER + " and the code."


@dataclass(frozen=True)
class BedDesign:
    """A test bed's design. Frozen: a bed's name stands for one fixed design.

    facts:          hidden constants per task (1..4), the first `facts` of FACTS.
    turns:          agent turns; the last is always an answer (at most turns-1 questions).
    p_state:        probability that a branch's constant is a literal the human states
                    (else an expression: the human replies "not sure"), per branch.
    p_doc:          probability that the reference has a docstring, which the human
                    reads out for the vague question (every constant); else "I don't know".
    one_side:       the human answers about one branch per message (the first named);
                    False: every branch the question names (legacy).
    p_guess_right:  share of tasks whose constant equals the fixed guess values[0], per
                    branch: an untold constant guessed right (legacy: 0, never right).
    p_ask:          the explorer asks on each turn before the last with this probability,
                    uniformly over the questions (one per fact, and the vague one); else
                    it answers, writing what it was told and the guess for the rest.
    p_other:        the explorer reads its dialogue: right after a question about one side
                    (fact), it asks about a side it has not asked yet with this probability
                    (uniformly among them), and otherwise chooses as p_ask says
                    (0: the blind explorer, whose choice ignores the dialogue).
    n_train/n_test: tasks per split; test tasks are fresh draws (another seed).
    n_val:          validation tasks: the next draws of the train split's stream after
                    its n_train (disjoint from them, never test tasks), for choosing
                    settings (testbed/learning.py).
    """

    __test__ = False  # not a pytest class

    name: str
    facts: int = 2
    turns: int = 3
    p_state: float = 0.75
    p_doc: float = 0.35
    one_side: bool = True
    p_guess_right: float = 0.5
    p_ask: float = 0.75
    p_other: float = 0.0
    n_train: int = 56
    n_test: int = 256  # many fresh draws of c, few episodes each: c decides most of the variance
    n_val: int = 128

    def __post_init__(self) -> None:
        checks = [("facts", 1 <= self.facts <= len(FACTS)), ("turns", self.turns >= 1),
                  ("p_state", 0.0 <= self.p_state <= 1.0), ("p_doc", 0.0 <= self.p_doc <= 1.0),
                  ("p_guess_right", 0.0 <= self.p_guess_right <= 1.0), ("p_ask", 0.0 <= self.p_ask <= 1.0),
                  ("p_other", 0.0 <= self.p_other <= 1.0),
                  ("n_train", self.n_train >= 1), ("n_test", self.n_test >= 1), ("n_val", self.n_val >= 0)]
        for field_name, ok in checks:
            if not ok:
                raise ValueError(f"BedDesign {self.name!r}: invalid {field_name}={getattr(self, field_name)!r}")

    @property
    def legacy(self) -> bool:
        """The first bed: its own task generator (testbed/env.py); its tasks carry no bed name."""
        return self.name == "legacy"

    @property
    def fact_list(self) -> tuple[Fact, ...]:
        return FACTS[: self.facts]

    def questions(self) -> tuple[str, ...]:
        """The explorer's questions: one per fact (in fact order), then the vague one."""
        return tuple(question(f) for f in self.fact_list) + (QUESTION_VAGUE,)


def question(fact: Fact) -> str:
    return f"What happens to {fact.word} numbers?"


PRESETS: dict[str, BedDesign] = {
    "default": BedDesign("default"),
    "long": BedDesign("long", facts=3, turns=5),
    "legacy": BedDesign("legacy", facts=2, turns=4, p_state=1.0, p_doc=0.0, one_side=False, p_guess_right=0.0,
                          p_ask=0.6, n_train=56, n_test=16),
}


def design(name: str | BedDesign) -> BedDesign:
    """The preset called `name` (a BedDesign passes through); a bad name is a one-line error."""
    if isinstance(name, BedDesign):
        return name
    if name not in PRESETS:
        raise ValueError(f"unknown test bed {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


BED_KEY = "bed"
"""The key naming the bed in task meta and in the records the lab writes (caches, settings,
summaries). Its earlier name "spec" (`OLD_BED_KEY`), in tasks and records written by earlier
versions, is read alike (`task_bed`, `bed_record`)."""
OLD_BED_KEY = "spec"


def task_bed(task) -> str | None:
    """The name of the bed a test-bed Task was drawn from: `meta["bed"]`, else the older
    `meta["spec"]`; None for a legacy task (the legacy bed's tasks carry no name, so they
    stay bit-identical)."""
    return task.meta.get(BED_KEY, task.meta.get(OLD_BED_KEY))


def task_design(task) -> BedDesign:
    """The design a test-bed Task was drawn from (`task_bed`; none: legacy)."""
    return design(task_bed(task) or "legacy")


def bed_record(record: dict) -> dict:
    """A record (a cache key, a settings file) with its earlier "spec" key under "bed", so a
    run or cache written by an earlier version is still recognised."""
    if OLD_BED_KEY in record and BED_KEY not in record:
        record = {BED_KEY if k == OLD_BED_KEY else k: v for k, v in record.items()}
    return record


def describe(s: BedDesign) -> str:
    return ", ".join(f"{f.name}={getattr(s, f.name)}" for f in fields(s))


# ---- the hidden reference: what c is, in source form ---------------------------------------


@dataclass(frozen=True)
class Hidden:
    """What a reference hides, read from its source: per fact its value and whether it is a
    literal the human can state, and whether there is a docstring."""

    values: tuple[int, ...]
    stated: tuple[bool, ...]
    doc: bool


def stated_sentence(fact: Fact, value: int) -> str:
    # A formula ("x * 3") rather than words: a tiny model copies it with an induction head.
    return f"For {fact.word} numbers it is x {fact.op} {value}."


def not_sure_sentence(fact: Fact) -> str:
    return f"For {fact.word} numbers I am not sure."


def reference_source(s: BedDesign, h: Hidden) -> str:
    """The hidden reference of a (non-legacy) task: one branch per fact, a literal or an
    expression (`int("3")`) per constant, and a docstring stating every constant or none."""
    facts = s.fact_list
    lines = ["def f(x):"]
    if h.doc:
        lines.append('    """' + " ".join(stated_sentence(f, v) for f, v in zip(facts, h.values)) + '"""')

    def ret(i: int) -> str:
        value = str(h.values[i]) if h.stated[i] else f'int("{h.values[i]}")'
        return f"return x {facts[i].op} {value}"

    for i in range(len(facts) - 1, 1, -1):  # huge, large: thresholds 100, 10
        lines += [f"    if x >= {10 ** (i - 1)}:", f"        {ret(i)}"]
    if len(facts) >= 2:
        lines += ["    if x >= 0:", f"        {ret(0)}", f"    {ret(1)}"]
    else:
        lines.append(f"    {ret(0)}")
    return "\n".join(lines) + "\n"


def read_reference(s: BedDesign, source: str) -> Hidden:
    """The Hidden of a reference (the inverse of reference_source), parsed, never run:
    the branch whose return is `x <op> K` is the fact with that operator; K a plain int
    literal is stated, anything else is an expression (its value read from `int("K")`)."""
    fn = _first_function(source)
    if fn is None:
        raise ValueError(f"not a test-bed reference (no function): {source[:80]!r}")
    found: dict[str, tuple[int, bool]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.BinOp) and type(node.value.op) in _OPS:
            op, right = _OPS[type(node.value.op)], node.value.right
            if _is_int(right):
                found[op] = (right.value, True)
            elif (isinstance(right, ast.Call) and isinstance(right.func, ast.Name) and right.func.id == "int"
                  and len(right.args) == 1 and isinstance(right.args[0], ast.Constant)):
                found[op] = (int(right.args[0].value), False)
    missing = [f.word for f in s.fact_list if f.op not in found]
    if missing:
        raise ValueError(f"not a {s.name!r} test-bed reference (no branch for {', '.join(missing)}): {source[:80]!r}")
    facts = s.fact_list
    return Hidden(tuple(found[f.op][0] for f in facts), tuple(found[f.op][1] for f in facts),
                  ast.get_docstring(fn) is not None)


def _first_function(source: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)


def _is_int(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def draw_hidden(s: BedDesign, rng: random.Random) -> Hidden:
    """One task's c: per fact, whether the value is the guess (p_guess_right) and whether
    it is stated (p_state); then whether there is a docstring (p_doc)."""
    values, stated = [], []
    for f in s.fact_list:
        values.append(f.values[0] if rng.random() < s.p_guess_right else f.values[1])
        stated.append(rng.random() < s.p_state)
    return Hidden(tuple(values), tuple(stated), rng.random() < s.p_doc)


def description(s: BedDesign) -> str:
    words = [f.word for f in s.fact_list]
    kinds = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return f"I need a function f(x) for my numbers. It treats {kinds} numbers differently. def f(x)"


# ---- the scripted human: a function of (reference, question) ---------------------------------


def named_facts(s: BedDesign, text: str) -> list[int]:
    """Indices of the facts a message names, in the order it names them."""
    low = text.lower()
    hits = sorted((low.find(f.word), i) for i, f in enumerate(s.fact_list) if f.word in low)
    return [i for _, i in hits]


def human_reply(s: BedDesign, reference: str, question_text: str) -> str:
    """The scripted human's reply to one agent message, on every preset (the one rule:
    testbed.human's simulator, the solver and the oracle all follow it): about the
    branch(es) it names (`one_side`: only the first named; else all, in fact order), stated
    if the reference's constant is a literal, "not sure" if it is an expression; a message
    naming none gets the docstring read out if the reference has one, else "I don't know".
    Never code, never random. A reference that is not the bed's is a ValueError."""
    h = read_reference(s, reference)
    named = named_facts(s, question_text)
    if not named:
        fn = _first_function(reference)
        return ast.get_docstring(fn) if h.doc else DONT_KNOW
    if s.one_side:
        named = named[:1]
    facts = s.fact_list
    return " ".join(stated_sentence(facts[i], h.values[i]) if h.stated[i] else not_sure_sentence(facts[i])
                    for i in sorted(named))


def told_values(s: BedDesign, replies: Sequence[str]) -> tuple[int | None, ...]:
    """Per fact, the value the human's replies stated (`x <op> K`), or None."""
    out = []
    for f in s.fact_list:
        pattern = re.compile(rf"\bx {re.escape(f.op)} (-?\d+)\b")
        found = next((m for r in replies for m in [pattern.search(r)] if m), None)
        out.append(int(found.group(1)) if found else None)
    return tuple(out)


# ---- answers ----------------------------------------------------------------------------------


def answer_text(s: BedDesign, values: Sequence[int]) -> str:
    """The agent's final message writing constants `values`, in the canonical form."""
    code = reference_source(s, Hidden(tuple(values), (True,) * s.facts, False))
    return f"{ANSWER_MARKER}\n```python\n{code}```"


def answer_values(s: BedDesign, text: str) -> tuple[int | None, ...]:
    """Per fact, the constant an agent's final message writes (None: missing, or code that
    does not compile). Read as the runner reads an answer (after the marker, else the
    whole message) and parsed, not run."""
    _, found, after = text.partition(ANSWER_MARKER)
    fn = _first_function(extract_code(after if found and after.strip() else text))
    if fn is None:
        return (None,) * s.facts
    got: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.BinOp) and type(node.value.op) in _OPS:
            if _is_int(node.value.right) and isinstance(node.value.left, ast.Name) and node.value.left.id == "x":
                got.setdefault(_OPS[type(node.value.op)], node.value.right.value)
    return tuple(got.get(f.op) for f in s.fact_list)


LEGACY_GUESS = (1, 0)  # the legacy explorer's guesses (x * 1, x + 0): outside the value sets, never right


def guess(s: BedDesign) -> tuple[int, ...]:
    """The fixed guess for each untold constant: values[0] (right on p_guess_right of the
    tasks); the legacy bed's never-right defaults."""
    return LEGACY_GUESS if s.legacy else tuple(f.values[0] for f in s.fact_list)


def guess_values(s: BedDesign, told: Sequence[int | None]) -> tuple[int, ...]:
    """What the explorer writes: each told constant, the fixed guess for the rest."""
    return tuple(g if t is None else t for g, t in zip(guess(s), told))


# ---- the scripted explorer: the one definition -------------------------------------------------


def explorer_probs(s: BedDesign, history: Sequence[str]) -> dict[str, float]:
    """The scripted explorer's next message as {text: probability}, from the dialogue so far
    (`history`: the agent's and the human's messages alternating, agent first, without the
    task description). Before the last turn it asks with probability p_ask, uniformly over
    `s.questions()`, whatever it already knows (with p_other > 0, right after a side
    question it asks a side not yet asked with probability p_other, else as above);
    otherwise (and always on the last turn) it answers with what the human stated and the fixed guess for the rest. A pure function:
    the solver's π0, the `explorer` agent and the warm start's dialogues all read it."""
    turn = (len(history) + 1) // 2  # agent turns already taken
    if turn >= s.turns:
        raise ValueError(f"the dialogue already has {turn} agent turns of {s.turns}")
    answer = answer_text(s, guess_values(s, told_values(s, history[1::2])))
    if turn == s.turns - 1 or s.p_ask == 0.0:
        return {answer: 1.0}
    qs = s.questions()
    probs = {q: s.p_ask / len(qs) for q in qs}
    if s.p_ask < 1.0:
        probs[answer] = 1.0 - s.p_ask
    if s.p_other > 0.0 and history and named_facts(s, history[-2]):  # right after a side question
        asked = {j for text in history[0::2] for j in named_facts(s, text)[:1]}
        others = [question(f) for j, f in enumerate(s.fact_list) if j not in asked]
        if others:
            probs = {t: (1.0 - s.p_other) * p for t, p in probs.items()}
            for q in others:
                probs[q] += s.p_other / len(others)
    return probs



def sample_explorer(s: BedDesign, history: Sequence[str], rng: random.Random) -> str:
    """One draw from `explorer_probs`: before the last turn one `rng.random()` decides
    asking (below the questions' total probability), then `rng.choice` picks among the
    equally likely questions (`rng.choices` by weight when they are not); the last turn answers without a draw. This is the random
    stream today's scripted dialogues consume, so legacy warm-start data stay identical."""
    probs = explorer_probs(s, history)
    questions = [t for t in probs if ANSWER_MARKER not in t]
    answer = next((t for t in probs if ANSWER_MARKER in t), None)
    if (len(history) + 1) // 2 >= s.turns - 1:
        return answer
    if rng.random() < sum(probs[q] for q in questions):
        weights = [probs[q] for q in questions]
        if max(weights) - min(weights) < 1e-12:  # the blind explorer: today's stream
            return rng.choice(questions)
        return rng.choices(questions, weights=weights)[0]
    return answer if answer is not None else rng.choice(questions)


# ---- the warm start's teachers: the explorer, blind or reading its dialogue --------------------

READS_P_OTHER = 0.5
"""The reading teacher's p_other on the default bed: its exact success is 0.540 (the blind
explorer's 0.490, the optimum 0.784; `python -m testbed.predict`), and its second question
repeats the first with probability 0.20 (the blind explorer's 1/3)."""
TEACHERS = {"reads": READS_P_OTHER, "blind": 0.0}


def default_teacher(s: str | BedDesign) -> str:
    """The warm start's teacher unless one is named: "reads" on a non-legacy bed, "blind" on the
    legacy bed (kept bit for bit)."""
    return "blind" if design(s).legacy else "reads"


def teacher_design(s: str | BedDesign, teacher: str | None = None, p_other: float | None = None) -> BedDesign:
    """The design whose explorer is the named warm-start teacher ("reads": p_other
    READS_P_OTHER, or `p_other`; "blind": 0, today's explorer; None: `default_teacher`). The
    solver's π0 (testbed.mdp.build) on this design is the teacher's exact tabular policy."""
    base = design(s)
    teacher = default_teacher(base) if teacher is None else teacher
    if teacher not in TEACHERS:
        raise ValueError(f"teacher: {teacher!r}; one of {', '.join(TEACHERS)}")
    if teacher == "blind" and p_other not in (None, 0.0):
        raise ValueError(f"p_other: {p_other} with teacher 'blind' (whose p_other is 0)")
    p = TEACHERS[teacher] if p_other is None else p_other
    if p > 0.0 and base.legacy:
        raise ValueError(f"teacher: {teacher!r} (p_other {p}) needs a non-legacy bed, not 'legacy'")
    return replace(base, p_other=p)
