"""Per-turn credit inspector: does the critic reward the right turns?

    python -m sweet.critic.inspect --critic runs/demo/critic --episodes runs/demo/episodes/train.jsonl \
        --output runs/demo/inspect [--candidates runs/demo/sweet/candidates.jsonl]

Writes OUTPUT/index.html, one self-contained page: every dialogue turn by turn,
each agent turn coloured by the critic's advantage A(o_t, a_t, c) (green above zero,
red below, number shown), the episode's reward, and for the states SWEET-RL stage 2
sampled (candidates.jsonl) the candidates ranked by the score the critic gave them.
Dialogue text is untrusted model output: everything is HTML-escaped and the page
loads nothing from anywhere.

Above the dialogues, the credit split (`credit_split`): over the critic's own pairs in
the episodes file (the pairing it was trained with, from its resolved config) whose two
trajectories have the same number of agent turns, so that both answer on the same turn,
how much of the Bradley-Terry margin Σ_t A(chosen) − Σ_t A(rejected) comes from the last
agent turn (the answer) and how much from the turns before it (the questions), and how
many pairs each part alone orders right. A critic that explains outcomes by the answer
alone (the earlier turns ordering pairs at chance) gives stage 2 nothing to rank
questions by, however well it fits its pairs (docs/testbed.md, "Where the learned critic
puts its credit"). A centred critic's advantages (`--baseline_samples_per_state`) are shown and split
centred, as it was trained: A − mean_k A(o_t, a_k, c) over its state's baseline samples.

A vision-language critic (sweet/critic/vision.py) is shown with what it saw: the target
page's screenshot beside each episode's title and, beside each agent turn's credit, the
screenshot of the agent's latest draft at that turn (thumbnails inlined as data: URLs, from
the critic's render cache).
"""

from __future__ import annotations

import html
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from colbench.envs import TrainingDefaults, env_names, training_defaults
from colbench.episodes import load_episodes
from colbench.io import atomic_write
from sweet.core.config import parse_configs
from sweet.core.records import episode_states, make_trajectory_pairs, read_candidates
from sweet.core.runs import run_cli, trainer_run
from sweet.core.tokens import text_ids
from sweet.critic.baseline import as_generated, read_baselines, state_key_of
from sweet.critic.model import CriticRecord, TrainedCritic, load_training_info


@dataclass
class InspectConfig:
    critic: str = field(default="", metadata={"help": "a train_critic output_dir (holds critic_config.json)"})
    episodes: str = field(default="", metadata={"help": "episodes JSONL to show"})
    output: str = field(default="", metadata={"help": "folder for index.html"})
    candidates: str = field(default="", metadata={"help": "stage-2 candidates.jsonl (optional): ranked candidates per state"})
    tasks: str = field(default="builtin:train", metadata={"help": "the episodes' tasks (for the training-time information c)"})
    max_episodes: int = field(default=60, metadata={"help": "show at most this many episodes (most-sampled tasks first)"})
    credit_split: bool = field(default=True, metadata={
        "help": "score every episode of the critic's pairs for the credit split (last turn vs earlier turns)"})
    device: str = field(default="", metadata={"help": "torch device (default: cuda if available)"})

    def __post_init__(self) -> None:
        for name in ("critic", "episodes", "output"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required")
        if self.max_episodes < 1:
            raise ValueError(f"--max_episodes must be >= 1, got {self.max_episodes}")


@dataclass
class TurnView:
    role: str
    text: str
    advantage: float | None = None  # agent turns only
    candidates: list[tuple[float, str]] | None = None  # stage-2 state: (score, text), best first
    screenshot: str | None = None  # vision critic: the latest draft it saw at this turn (a data: URL)


@dataclass
class EpisodeView:
    episode_id: str
    task_id: str
    reward: float
    success: bool
    turns: list[TurnView]
    target: str | None = None  # vision critic: the target page's screenshot, c (a data: URL)


def score_episodes(scorer, episodes, info_of: dict[str, str]) -> list[list[float]]:
    """The critic's A(o_t, a_t, c) for every agent turn of every episode, through the
    scorer's public API (`score_trajectories`: an episode that is one token sequence is one
    forward pass; turns without recorded ids are tokenised once)."""
    vision = getattr(scorer, "view", None) is not None  # it reads the turn's text in its own tokenizer
    trajectories = []
    for ep in episodes:
        turns = []
        for state, turn in zip(episode_states(ep, info_of[ep.task_id]), ep.agent_turns):
            ids = turn.token_ids if turn.token_ids is not None and not vision else text_ids(scorer.tokenizer, turn.content)
            turns.append((state, list(ids), getattr(turn, "finish_reason", None)))
        trajectories.append(turns)
    return scorer.score_trajectories(trajectories)


@dataclass
class CreditSplit:
    """Where a critic's Bradley-Terry margin on trajectory pairs of equal length sits: per
    pair, the margin Σ_t A(o_t, a_t, c) of the chosen minus the rejected, split into the last
    agent turn's terms (`last`: the answer) and the earlier turns' (`earlier`), as means over
    pairs, and the share of pairs each part alone orders right (a tie counts half)."""

    pairs: int
    earlier: float
    last: float
    ordered_by_earlier: float
    ordered_by_last: float

    @property
    def last_share(self) -> float:
        """The last turn's share of the mean margin (may leave [0, 1] when the parts disagree)."""
        total = self.earlier + self.last
        return self.last / total if total else float("nan")

    def to_json(self) -> dict:
        share = self.last_share
        return {"pairs": self.pairs, "earlier": self.earlier, "last": self.last,
                "last_share": None if share != share else share,  # strict JSON: no NaN
                "ordered_by_earlier": self.ordered_by_earlier, "ordered_by_last": self.ordered_by_last}

    @classmethod
    def from_json(cls, d: dict) -> "CreditSplit":
        return cls(d["pairs"], d["earlier"], d["last"], d["ordered_by_earlier"], d["ordered_by_last"])

    def line(self) -> str:
        return (f"critic credit on {self.pairs} trajectory pairs of equal length (its pairing): mean margin "
                f"{self.earlier + self.last:+.2f}, {self.last_share:.0%} of it on the last turn (answer "
                f"{self.last:+.2f}, earlier turns {self.earlier:+.2f}); pairs ordered by the earlier turns alone {self.ordered_by_earlier:.2f}, "
                f"by the last turn alone {self.ordered_by_last:.2f}")


def credit_split(pairs, advantages: dict[str, Sequence[float]]) -> CreditSplit:
    """The CreditSplit of trajectory `pairs` (sweet.core.records.Pair of episodes) given each
    episode's per-turn advantages (`advantages[episode_id]`, in agent-turn order); pairs
    whose trajectories differ in length are left out (there the last turn of the shorter
    is an early answer: a decision, not the answer's content)."""
    pairs = [p for p in pairs if len(advantages[p.chosen.episode_id]) == len(advantages[p.rejected.episode_id])]
    if not pairs:
        raise ValueError("credit_split: no pairs")

    def parts(ep) -> tuple[float, float]:
        advs = advantages[ep.episode_id]
        return float(sum(advs[:-1])), float(advs[-1])

    def hit(d: float) -> float:
        return 1.0 if d > 0 else 0.5 if d == 0 else 0.0

    earlier = last = by_earlier = by_last = 0.0
    for pair in pairs:
        (ce, cl), (re_, rl) = parts(pair.chosen), parts(pair.rejected)
        earlier, last = earlier + ce - re_, last + cl - rl
        by_earlier, by_last = by_earlier + hit(ce - re_), by_last + hit(cl - rl)
    n = len(pairs)
    return CreditSplit(n, earlier / n, last / n, by_earlier / n, by_last / n)


def training_pairs(critic_dir: str, episodes) -> list:
    """The critic's trajectory pairs among `episodes`, with the pairing settings of its run
    (critic_dir/config.json, written by sweet.train_critic); a setting it lacks (a run from
    before it was recorded) is its environment's default (colbench.envs.training_defaults)."""
    config = Path(critic_dir) / "config.json"
    settings = json.loads(config.read_text()).get("critic", {}) if config.exists() else {}
    env = settings.get("env") or (episodes[0].env if episodes else "backend")
    defaults = training_defaults(env) if env in env_names() else TrainingDefaults()
    pick = lambda name: settings[name] if settings.get(name) is not None else getattr(defaults, name)  # noqa: E731
    # a run recorded before the rule was (settings without it) paired the best against each worse
    recorded = "success_threshold" in settings or "min_reward_gap" in settings
    rule = settings.get("pairing_rule") or ("best" if recorded else defaults.pairing_rule)
    return make_trajectory_pairs(episodes, pick("success_threshold"), pick("min_reward_gap"), rule)


def read_candidate_rows(path: str) -> dict[tuple[str, int], list[tuple[float, str]]]:
    """(episode_id, turn_index) -> [(score, text)] best first, from stage 2's candidates.jsonl."""
    if not path:
        return {}
    return {(row.episode_id, row.turn_index): sorted(((c.advantage, c.text) for c in row.candidates), key=lambda c: -c[0])
            for row in read_candidates(path).values()}


def build_views(episodes, advantages: Sequence[Sequence[float]],
                candidates: dict[tuple[str, int], list[tuple[float, str]]],
                shots: dict[tuple[str, int], str | None] | None = None) -> list[EpisodeView]:
    """`shots`: (episode_id, agent turn) -> the draft screenshot the critic saw, and
    (episode_id, -1) -> the target's (`screenshots`)."""
    shots = shots or {}
    views = []
    for ep, advs in zip(episodes, advantages):
        turns, k = [], 0
        for turn in ep.turns:
            if turn.role == "agent":
                turns.append(TurnView("agent", turn.content, advs[k], candidates.get((ep.episode_id, k)),
                                      shots.get((ep.episode_id, k))))
                k += 1
            else:
                turns.append(TurnView(turn.role, turn.content))
        views.append(EpisodeView(ep.episode_id, ep.task_id, float(ep.reward), bool(ep.success), turns,
                                 shots.get((ep.episode_id, -1))))
    return views


THUMB_WIDTH = 320


def screenshots(scorer, episodes, info_of: dict[str, str]) -> dict[tuple[str, int], str | None]:
    """What a vision-language critic saw ({} for a text critic): (episode_id, agent turn) ->
    the latest draft's screenshot, (episode_id, -1) -> the target's, as PNG data: URLs of
    THUMB_WIDTH-px thumbnails; None where there was no draft or the page did not render."""
    import base64
    import io

    view = getattr(scorer, "view", None)
    if view is None:
        return {}
    thumbs: dict[str, str | None] = {}

    def thumb(page: str | None) -> str | None:
        if page is None:
            return None
        if page not in thumbs:
            [res] = view.renders.render([page])
            if not res.ok:
                thumbs[page] = None
            else:
                image = res.image.copy()
                image.thumbnail((THUMB_WIDTH, THUMB_WIDTH * 4))
                buf = io.BytesIO()
                image.save(buf, format="PNG")
                thumbs[page] = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        return thumbs[page]

    out: dict[tuple[str, int], str | None] = {}
    for ep in episodes:
        for k, (state, turn) in enumerate(zip(episode_states(ep, info_of[ep.task_id]), ep.agent_turns)):
            target, draft = view.pages(state, view.action_ids(turn.content, None), scorer.record.training_info)
            out[(ep.episode_id, k)] = thumb(draft)
            out.setdefault((ep.episode_id, -1), thumb(target))
    return out


def _colour(value: float, scale: float) -> str:
    """Green for positive, red for negative advantages; opacity grows with |value|."""
    alpha = min(1.0, abs(value) / scale) * 0.55 if scale > 0 else 0.0
    rgb = "22,163,74" if value >= 0 else "220,38,38"
    return f"rgba({rgb},{alpha:.2f})"


CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:70em;color:#111}
.ep{border:1px solid #ccc;border-radius:6px;margin:1em 0;padding:.6em}
.head{font-weight:600;margin-bottom:.4em}.ok{color:#15803d}.bad{color:#b91c1c}
.turn{margin:.3em 0;padding:.35em .5em;border-radius:4px;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em}
.human{background:#f1f5f9}.adv{float:right;font-weight:700;font-family:system-ui}
.shot{float:right;clear:right;max-width:240px;margin:0 0 .3em .6em;border:1px solid #999}
.target{display:block;max-width:240px;border:2px solid #15803d;margin:.3em 0}.turn::after{content:"";display:block;clear:both}
details{margin:.2em 0 .5em 2em;font-size:.85em}table{border-collapse:collapse}
td{border-top:1px solid #ddd;padding:.2em .5em;vertical-align:top;white-space:pre-wrap;font-family:ui-monospace,monospace}
"""


def render_html(views: Sequence[EpisodeView], title: str, note: str) -> str:
    e = html.escape
    scores = [t.advantage for v in views for t in v.turns if t.advantage is not None]
    scores += [s for v in views for t in v.turns for s, _ in (t.candidates or [])]
    scale = max((abs(s) for s in scores), default=0.0)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{e(title)}</h1><p>{e(note)}</p>"]
    for v in views:
        status = "<span class='ok'>success</span>" if v.success else "<span class='bad'>no success</span>"
        parts.append(f"<div class='ep'><div class='head'>{e(v.task_id)} · {e(v.episode_id)} · reward {v.reward:.2f} · "
                     f"{status}</div>")
        if v.target:
            parts.append(f"<div>target page (c): <img class='target' src='{e(v.target)}' alt='target page'></div>")
        for t in v.turns:
            if t.advantage is None:
                parts.append(f"<div class='turn human'><b>{e(t.role)}:</b> {e(t.text)}</div>")
                continue
            shot = (f"<img class='shot' src='{e(t.screenshot)}' alt='the latest draft the critic saw'>"
                    if t.screenshot else "")
            parts.append(f"<div class='turn' style='background:{_colour(t.advantage, scale)}'>"
                         f"<span class='adv'>A = {t.advantage:+.3f}</span>{shot}<b>agent:</b> {e(t.text)}</div>")
            if t.candidates:
                rows = "".join(f"<tr><td>{i + 1}</td><td style='background:{_colour(s, scale)}'>{s:+.3f}</td>"
                               f"<td>{e(txt)}</td></tr>" for i, (s, txt) in enumerate(t.candidates))
                parts.append(f"<details open><summary>stage 2: {len(t.candidates)} candidates at this state, "
                             f"ranked by the critic</summary><table>{rows}</table></details>")
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def pick_episodes(episodes, candidates, limit: int):
    """Episodes with stage-2 states first (in file order), then the rest, at most `limit`."""
    staged = {eid for eid, _ in candidates}
    ordered = [ep for ep in episodes if ep.episode_id in staged] + [ep for ep in episodes if ep.episode_id not in staged]
    return ordered[:limit]


def main(cfg: InspectConfig) -> Path:
    """Score the episodes with the critic and write the page; returns its path."""
    record = CriticRecord.load(cfg.critic)
    candidates = read_candidate_rows(cfg.candidates)
    every = load_episodes(cfg.episodes, env=record.env)
    episodes = pick_episodes(every, candidates, cfg.max_episodes)
    info_of = load_training_info(cfg.tasks, env=record.env)
    missing = sorted({ep.task_id for ep in episodes} - set(info_of))
    if missing:
        raise ValueError(f"{cfg.episodes}: tasks {missing[:3]} are not in --tasks {cfg.tasks}")
    scorer = TrainedCritic.load(cfg.critic, device=cfg.device or None)
    pairs = credit_pairs(cfg.critic, every, info_of) if cfg.credit_split else []
    # one scoring pass for the page's episodes and the split's (they overlap)
    advantages = advantages_of(scorer, [*episodes, *(e for p in pairs for e in (p.chosen, p.rejected))], info_of,
                               read_baselines(cfg.critic))
    views = build_views(episodes, [advantages[ep.episode_id] for ep in episodes], candidates,
                        screenshots(scorer, episodes, info_of))
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    note = (f"critic {cfg.critic}; episodes {cfg.episodes}; A(o_t, a_t, c) per agent turn "
            f"(green > 0 > red); stage-2 candidates from {cfg.candidates or '(none given)'}.")
    if pairs:
        split = credit_split(pairs, advantages)
        atomic_write(out / "credit_split.json", json.dumps(split.to_json(), indent=2))
        print(split.line())
        note += " " + split.line() + "."
    page = out / "index.html"
    atomic_write(page, render_html(views, "SWEET-RL critic: per-turn credit", note))
    print(f"credit inspector: {page} ({len(views)} episodes, {sum(1 for _ in candidates)} stage-2 states)")
    return page


def credit_pairs(critic_dir: str, episodes, info_of: dict[str, str]) -> list:
    """The pairs the critic's pairing makes from `episodes` whose task has c and whose two
    trajectories have the same number of agent turns (the credit split's pairs)."""
    return [p for p in training_pairs(critic_dir, episodes) if p.task_id in info_of
            and len(p.chosen.agent_turns) == len(p.rejected.agent_turns)]


def advantages_of(scorer, episodes, info_of: dict[str, str], baselines: dict[str, tuple] | None = None
                  ) -> dict[str, list[float]]:
    """episode_id -> the critic's per-turn advantages, each episode scored once. A centred
    critic's (`baselines`: sweet.critic.baseline.read_baselines) are centred as in its
    training, A − mean_k A(o_t, a_k, c), on every turn whose state has samples."""
    unique = list({ep.episode_id: ep for ep in episodes}.values())
    raw = score_episodes(scorer, unique, info_of)
    if baselines:
        raw = centre_by_baselines(scorer, unique, raw, info_of, baselines)
    return {ep.episode_id: advs for ep, advs in zip(unique, raw)}


def centre_by_baselines(scorer, episodes, raw: list[list[float]], info_of: dict[str, str],
                        baselines: dict[str, tuple]) -> list[list[float]]:
    """Subtract from each turn's A the mean A of its state's baseline samples (the key the
    critic was trained with: c, or "" for a critic without it)."""
    eos = scorer.record.eos_token_id
    items, where = [], []
    for e, ep in enumerate(episodes):
        for t, state in enumerate(episode_states(ep, info_of[ep.task_id])):
            key = state_key_of(state.prompt, state.training_info if scorer.record.training_info else "")
            if key in baselines:
                generated = [as_generated(a, eos) for a in baselines[key]]
                items.append((state, [g for g, _ in generated], [r for _, r in generated]))
                where.append((e, t))
    out = [list(a) for a in raw]
    for (e, t), scores in zip(where, scorer.score_states(items)):
        out[e][t] -= sum(scores) / len(scores)
    return out


def score_credit_split(scorer, critic_dir: str, episodes, info_of: dict[str, str]) -> CreditSplit | None:
    """The credit split of the critic in `critic_dir` (its `scorer`) over its `credit_pairs`
    from `episodes` (None when there are none)."""
    pairs = credit_pairs(critic_dir, episodes, info_of)
    if not pairs:
        return None
    return credit_split(pairs, advantages_of(scorer, [e for p in pairs for e in (p.chosen, p.rejected)], info_of,
                                             read_baselines(critic_dir)))


def cli(argv: list[str] | None = None) -> Path:
    """`python -m sweet.critic.inspect`: parse the command line, then `main(cfg)`."""
    (cfg,) = parse_configs([InspectConfig], argv, description=__doc__.split("\n\n")[0])
    with trainer_run(cfg.output, command="python -m sweet.critic.inspect"):
        return main(cfg)


if __name__ == "__main__":
    sys.exit(run_cli(cli, prog="python -m sweet.critic.inspect"))
