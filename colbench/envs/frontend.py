"""ColBench frontend design: the agent builds a web page with a simulated human.

    from colbench.envs import make_env
    env = make_env("frontend", render_dir="runs/x/renders")   # FrontendEnv
    msgs = env.agent_messages(task, turns)       # system + site idea + dialogue
    env.is_final(text); html = env.episode_answer(task, turns)   # the last draft of any turn
    scores = env.score(tasks, answers)           # CLIP cosine of the two renders
    env.renderer                                 # the RenderPool simulators share

Each agent turn may hold one HTML draft (`extract_html`: a ```html fence, a fenced block of
markup, an <html> document, a <body> element, or a message that is markup; prose is never a
draft); the simulated human sees it rendered next to the hidden target and says how they
differ (simulators.vlm, simulators.text_frontend). The scored answer is the last draft the
agent wrote in any turn (`episode_answer`; the episode records its turn), as the published
environment scores its last rendered draft; an episode without a draft scores 0 with that
reason, never its prose rendered as a page.

Scoring renders the answer and the target offline (colbench.scoring.render: vendored
Tailwind, local placeholder images, no network) and takes the cosine similarity of
their CLIP image embeddings (colbench.scoring.clip; paper: OpenAI ViT-B/32).
Success = reward >= `success_threshold`. Target embeddings are cached per task; targets
render with their own generous timeout (`target_timeout_s`), so load never fails a good one
(a target that does not render at all is an unusable row: colbench.tasks.check_targets).
Departures from the reference: the answer is kept as HTML (the Episode stores it;
Score.detail holds the screenshot paths), whole pages are embedded (scheme "pad",
not a 224-px centre crop), and no draft scores 0 instead of the cosine of a black image.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from colbench.envs.base import TrainingDefaults, agent_chat, fill_instructions
from colbench.prompts import KINDS, load_prompt
from colbench.protocols import ANSWER_MARKER
from colbench.tasks import TARGET_TIMEOUT_S  # a target page's render budget, the loader's check's too
from colbench.types import Score, Task, Turn
from engines.base import Message

if TYPE_CHECKING:
    from colbench.scoring.clip import ClipScorer
    from colbench.scoring.render import RenderPool

FRONTEND_SCORING_VERSION = 3
NO_DRAFT = "no HTML draft in any agent turn"  # Score.error of an episode without a page to render
PROMPT_PATH = KINDS["frontend_agent"].default_path()  # the registry's default (colbench.prompts)
SINGLE_TURN_NOTE = (
    "\n\nThis time you get a single turn and no feedback: answer now. Write \"{answer_marker}\" "
    "followed by the complete HTML document in a ```html code block."
)

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|$)", re.DOTALL)
_HTML_DOC = re.compile(r"(?:<!DOCTYPE html[^>]*>\s*)?<html\b.*?(?:</html\s*>|$)", re.DOTALL | re.IGNORECASE)
_BODY = re.compile(r"<body\b.*?(?:</body\s*>|$)", re.DOTALL | re.IGNORECASE)


def extract_html(text: str) -> str:
    """The HTML draft in an agent message, "" when it holds none: the first ```html block,
    else the first fenced block that looks like markup, else an <html>...</html> document,
    else a <body>...</body> element, else the whole message when it is markup (starts with
    "<" and ends with ">"). Prose is never a draft."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    for lang, body in blocks:
        if lang in ("html", "htm", "xhtml"):
            return body.strip()
    for _, body in blocks:
        if "<" in body and ">" in body:
            return body.strip()
    for pattern in (_HTML_DOC, _BODY):
        m = pattern.search(text)
        if m:
            return m.group(0).strip()
    bare = text.strip()
    return bare if bare.startswith("<") and bare.endswith(">") else ""


def has_html(text: str) -> bool:
    """Whether an agent message holds a draft to render (`extract_html` finds one)."""
    return bool(extract_html(text))


def _slug(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", task_id)[:80] or "task"


class FrontendEnv:
    """Environment contract (colbench.protocols.Environment) for ColBench frontend design.

    answer_marker:     the agent ends the dialogue with it (paper: "I WANT TO ANSWER:").
    max_turns:         agent turns at most (paper: 10).
    success_threshold: success = CLIP cosine >= this.
    clip_model, clip_pretrained, clip_scheme, clip_device: the ClipScorer ("tiny" for tests).
    render_dir:        where screenshots go (answers/, targets/); default a temp dir.
    workers:           browser contexts rendering at once.
    render_timeout_s:  per answer page; a page past it scores 0 with Score.error.
    target_timeout_s:  per target page (generous: a target is known to render, load must
                       not fail it; TARGET_TIMEOUT_S).
    score_chunk:       answers rendered and scored per chunk by `score_iter` (each chunk
                       is saved before the next starts).
    prompt_path:       the agent's instructions, a frontend_agent template file
                       (colbench.prompts; None: ours); `agent_prompt` is the loaded template.
    """

    name = "frontend"
    # The published frontend pairing (sweet_rl scripts/evaluate_html.py, lines 121-149): every
    # two episodes of a task whose CLIP scores differ by at least 0.1, the higher chosen; a
    # cosine has no "success". RFT imitates the best quarter of the episodes (our choice).
    training_defaults = TrainingDefaults(pairing_rule="all", success_threshold=0.0, min_reward_gap=0.1,
                                         rft_top_fraction=0.25)
    # the simulated human's replies are cut at this many characters unless --max_reply_chars says
    # otherwise (published human_design_interaction_env.py, line 14: 1,000; backend 400)
    max_reply_chars = 1000
    # the scoring rules' version, recorded on every episode (colbench.episodes): 3 scores the last
    # draft of any turn, no draft 0, unrenderable targets unusable (2: the final message, prose rendered)
    scoring_version = FRONTEND_SCORING_VERSION

    def __init__(self, answer_marker: str = ANSWER_MARKER, max_turns: int = 10,
                 success_threshold: float = 0.9, clip_model: str = "ViT-B-32", clip_pretrained: str = "openai",
                 clip_scheme: str = "pad", clip_device: str | None = None, render_dir: str | Path | None = None,
                 workers: int = 2, render_timeout_s: float = 10.0, target_timeout_s: float = TARGET_TIMEOUT_S,
                 viewport_width: int = 1280, viewport_height: int = 800, max_height: int = 8000,
                 prompt_path: str | Path | None = None,
                 score_chunk: int = 32):
        if not answer_marker.strip():
            raise ValueError("FrontendEnv.answer_marker must be non-empty")
        if max_turns < 1:
            raise ValueError(f"FrontendEnv.max_turns must be >= 1, got {max_turns}")
        if not 0.0 <= success_threshold <= 1.0:
            raise ValueError(f"FrontendEnv.success_threshold must be in [0, 1], got {success_threshold}")
        if score_chunk < 1:
            raise ValueError(f"FrontendEnv.score_chunk must be >= 1, got {score_chunk}")
        self.answer_marker = answer_marker
        self.max_turns = max_turns
        self.score_chunk = score_chunk
        self.success_threshold = success_threshold
        self.clip_options = dict(model=clip_model, pretrained=clip_pretrained, scheme=clip_scheme, device=clip_device)
        self.render_options = dict(workers=workers, timeout_s=render_timeout_s, viewport_width=viewport_width,
                                   viewport_height=viewport_height, max_height=max_height)
        self.target_timeout_s = float(target_timeout_s)
        self._render_dir = Path(render_dir) if render_dir is not None else None
        # the agent's instructions: a validated template file (colbench.prompts), recorded on every episode
        self.agent_prompt = load_prompt("frontend_agent", prompt_path)
        self._template = self.agent_prompt.text
        self._renderer: RenderPool | None = None
        self._scorer: ClipScorer | None = None
        self._targets: dict[tuple[str, str], tuple[str, Any, None]] = {}  # (task_id, html hash) -> (png, embedding, None)
        self._lock = threading.Lock()

    # ---- dialogue

    def system_prompt(self, single_turn: bool = False) -> str:
        return fill_instructions(self._template, SINGLE_TURN_NOTE, max_turns=self.max_turns,
                                 answer_marker=self.answer_marker, single_turn=single_turn)

    def agent_messages(self, task: Task, turns: Sequence[Turn], single_turn: bool = False) -> list[Message]:
        """System instructions, the site idea as the human's first message, then the
        dialogue (agent turns as "assistant", human feedback as "user")."""
        return agent_chat(self.system_prompt(single_turn), task.description, turns)

    def is_final(self, agent_text: str) -> bool:
        return self.answer_marker in agent_text

    def extract_answer(self, agent_text: str) -> str:
        """The draft of one agent message: the HTML after the marker, else the HTML in the
        whole message; "" when it holds none (`extract_html`)."""
        _, found, after = agent_text.partition(self.answer_marker)
        return (extract_html(after) if found else "") or extract_html(agent_text)

    def answer_turn(self, task: Task, turns: Sequence[Turn]) -> int | None:
        """Which agent turn (index among the agent turns) holds the last draft; None: no draft."""
        agent = [t for t in turns if t.role == "agent"]
        return next((i for i in range(len(agent) - 1, -1, -1) if self.extract_answer(agent[i].content)), None)

    def episode_answer(self, task: Task, turns: Sequence[Turn]) -> str:
        """The answer scored: the last HTML draft the agent wrote in any turn (the published
        environment scores its last rendered draft); "" when no turn holds one (scores 0)."""
        i = self.answer_turn(task, turns)
        return "" if i is None else self.extract_answer([t for t in turns if t.role == "agent"][i].content)

    def training_info(self, task: Task) -> str:
        """The target page's HTML: SWEET-RL's training-time information for the critic."""
        return task.hidden

    # ---- shared machinery (lazy: building prompts needs neither a browser nor CLIP)

    @property
    def renderer(self) -> "RenderPool":
        """The RenderPool this env renders with; simulators share it."""
        with self._lock:
            if self._renderer is None:
                from colbench.scoring.render import RenderPool

                self._renderer = RenderPool(**self.render_options)
            return self._renderer

    @property
    def scorer(self) -> "ClipScorer":
        with self._lock:
            if self._scorer is None:
                from colbench.scoring.clip import ClipScorer

                opts = self.clip_options
                self._scorer = ClipScorer(opts["model"], opts["pretrained"], scheme=opts["scheme"], device=opts["device"])
            return self._scorer

    @property
    def render_dir(self) -> Path:
        with self._lock:
            if self._render_dir is None:
                self._render_dir = Path(tempfile.mkdtemp(prefix="colbench-frontend-"))
            return self._render_dir

    # ---- scoring

    def score(self, tasks: Sequence[Task], answers: Sequence[str]) -> list[Score]:
        """Render answers and targets, reward = CLIP cosine of the two screenshots.
        A render failure or timeout scores 0 (Score.error); never raises for one answer.
        (A CLIP model that cannot be loaded is a setup error and does raise.)"""
        if len(tasks) != len(answers):
            raise ValueError(f"score: {len(tasks)} tasks but {len(answers)} answers")
        if not tasks:
            return []
        targets = self._target_embeddings(tasks)
        todo = [i for i, a in enumerate(answers) if a.strip()]
        paths = [self.render_dir / "answers" / f"{_slug(tasks[i].task_id)}-{_digest(answers[i])}.png" for i in todo]
        renders = dict(zip(todo, self.renderer.render([answers[i] for i in todo], paths)))
        ok = [i for i in todo if renders[i].ok and targets[i][1] is not None]
        embeddings = dict(zip(ok, self.scorer.embed([renders[i].image for i in ok]))) if ok else {}
        scores = []
        for i, (task, answer) in enumerate(zip(tasks, answers)):
            target_png, target_emb, target_error = targets[i]
            detail: dict[str, Any] = {"answer_png": None, "target_png": target_png, "answer_html_chars": len(answer)}
            res = renders.get(i)
            if res is not None and res.ok:
                detail.update(answer_png=str(res.png_path), answer_page_height=res.page_height)
            error = (NO_DRAFT if not answer.strip() else
                     f"target render failed: {target_error}" if target_error else
                     f"answer render failed: {res.error}" if not res.ok else None)
            if error:
                scores.append(Score(0.0, False, detail, error))
                continue
            reward = float((embeddings[i] * target_emb).sum().clamp(-1.0, 1.0))
            scores.append(Score(reward, reward >= self.success_threshold, detail))
        return scores

    def score_iter(self, tasks: Sequence[Task], answers: Sequence[str]) -> Iterator[tuple[int, Score]]:
        """`score`, yielding (index, Score) a chunk of `score_chunk` answers at a time, so the
        runner saves each chunk before the next one is rendered (a 1,000-page test split
        shows progress and resumes from the last chunk)."""
        if len(tasks) != len(answers):
            raise ValueError(f"score: {len(tasks)} tasks but {len(answers)} answers")
        for start in range(0, len(tasks), self.score_chunk):
            stop = start + self.score_chunk
            yield from enumerate(self.score(tasks[start:stop], answers[start:stop]), start)

    def _target_embeddings(self, tasks: Sequence[Task]) -> list[tuple[str | None, Any, str | None]]:
        """(png path, CLIP embedding, error) of each task's target; rendered and embedded
        once per (task_id, target HTML)."""
        keys = [(t.task_id, _digest(t.hidden)) for t in tasks]
        missing = {k: t for k, t in zip(keys, tasks) if k not in self._targets}
        if missing:
            paths = [self.render_dir / "targets" / f"{_slug(k[0])}-{k[1]}.png" for k in missing]
            renders = self.renderer.render([t.hidden for t in missing.values()], paths, timeout_s=self.target_timeout_s)
            ok = [(k, r) for k, r in zip(missing, renders) if r.ok]
            embs = self.scorer.embed([r.image for _, r in ok]) if ok else []
            with self._lock:
                for (k, r), e in zip(ok, embs):
                    self._targets[k] = (str(r.png_path), e, None)
            failed = {k: r.error for k, r in zip(missing, renders) if not r.ok}  # not cached: retried next time
        else:
            failed = {}
        return [self._targets[k] if k in self._targets else (None, None, failed.get(k, "not rendered")) for k in keys]

    def close(self) -> None:
        """Close the browser (screenshots under render_dir are kept)."""
        with self._lock:
            if self._renderer is not None:
                self._renderer.close()
                self._renderer = None


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:12]
