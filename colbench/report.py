"""Leaderboard rows and the files an evaluation writes: leaderboard.json,
leaderboard.md and a self-contained report.html (plots embedded as base64 PNG).

    rows = [build_row(name, spec, "backend", episodes) for ...]
    write_reports(out_dir, rows, episodes_by_agent, env="backend")
"""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from colbench.io import atomic_write
from colbench.stats import Metric, behaviour_stats, env_metrics
from colbench.types import STOP_UNUSABLE, Episode, Task

# Metric display order and labels.
METRIC_LABELS = {
    "tests_passed": "tests passed",
    "success_rate": "success",
    "clip_similarity": "CLIP similarity",
    "win_rate": "win rate",
}
BEHAVIOUR_LABELS = {
    "mean_turns": "mean turns",
    "asked_before_answering": "asked first",
    "answered_without_asking": "answered at once",
    "mean_agent_reply_chars": "reply chars",
    "simulator_dont_know_rate": "sim. don't know",
    "simulator_failures": "sim. failures",
    "answer_parses": "answer parses",
    "leaks": "leaks",
    "leaks_replaced": "leaks replaced",
    "engine_errors": "engine errors",
}
FIRST_ERROR_CHARS = 300  # the first engine error, as the leaderboard's note quotes it


@dataclass
class LeaderboardRow:
    """One agent's line of the leaderboard."""

    agent: str
    spec: str
    env: str
    n_tasks: int
    n_episodes: int
    metrics: dict[str, Metric]
    behaviour: dict[str, Any] = field(default_factory=dict)
    baseline: bool = False
    # tasks whose row is unusable (scored 0, in n_tasks): [{"task_id", "where", "reason"}]
    unusable: list[dict[str, str]] = field(default_factory=list)
    scoring_version: int | None = None  # the rules its episodes were scored under

    @property
    def n_unusable(self) -> int:
        return len(self.unusable)
    # role -> [{"kind", "path", "sha256"}, ...]: the prompt files its episodes were built with
    # (colbench.prompts; episode meta["prompts"]), one per role unless episodes differ
    prompts: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent, "spec": self.spec, "env": self.env, "baseline": self.baseline,
            "n_tasks": self.n_tasks, "n_episodes": self.n_episodes,
            "n_unusable_tasks": self.n_unusable, "unusable_tasks": self.unusable,
            "scoring_version": self.scoring_version,
            "metrics": {k: m.to_json() for k, m in self.metrics.items()},
            "behaviour": self.behaviour,
            "prompts": self.prompts,
        }


def episodes_prompts(episodes: Sequence[Episode]) -> dict[str, list[dict[str, str]]]:
    """role -> the distinct prompt records (path + sha256) of the episodes, in first-seen order."""
    out: dict[str, list[dict[str, str]]] = {}
    for ep in episodes:
        for role, rec in (ep.meta.get("prompts") or {}).items():
            if rec not in out.setdefault(role, []):
                out[role].append(rec)
    return out


def build_row(agent: str, spec: str, env: str, episodes: Sequence[Episode],
              baseline: Sequence[Episode] | None = None, is_baseline: bool = False) -> LeaderboardRow:
    """One agent's row. Episodes of unusable tasks (stop reason "unusable_task") count in
    every denominator, scored 0, and are listed in `unusable`."""
    from colbench.episodes import current_scoring_version, episode_scoring_version

    unusable: dict[str, dict[str, str]] = {}
    for ep in episodes:
        if ep.stop_reason == STOP_UNUSABLE and ep.task_id not in unusable:
            unusable[ep.task_id] = {"task_id": ep.task_id, "where": str(ep.meta.get("where", "")),
                                    "reason": str(ep.meta.get("unusable", ""))}
    versions = {episode_scoring_version(ep) for ep in episodes}
    return LeaderboardRow(
        agent=agent, spec=spec, env=env,
        n_tasks=len({ep.task_id for ep in episodes}), n_episodes=len(episodes),
        metrics=env_metrics(env, episodes, baseline), behaviour=behaviour_stats(episodes), baseline=is_baseline,
        unusable=sorted(unusable.values(), key=lambda u: _where_key(u["where"])),
        scoring_version=versions.pop() if len(versions) == 1 else current_scoring_version(env),
        prompts=episodes_prompts(episodes),
    )


def _where_key(where: str) -> tuple[str, int]:
    head, _, tail = where.rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (where, 0)


def unusable_lines(rows: Sequence[LeaderboardRow]) -> list[str]:
    """The unusable tasks, said once (they are the same for every agent): a summary line
    (how many of how many, the best success possible) and one line per task."""
    row = max(rows, key=lambda r: r.n_unusable, default=None)
    if row is None or not row.n_unusable:
        return []
    ceiling = 100 * (row.n_tasks - row.n_unusable) / max(1, row.n_tasks)
    head = (f"Unusable tasks: {row.n_unusable} of {row.n_tasks} (scored 0 for every agent, counted in every "
            f"denominator: the best possible success is {ceiling:.1f}%):")
    return [head] + [f"- {u['where']} ({u['task_id']}): {u['reason']}" for u in row.unusable]


def _pct(m: Metric, metric: str) -> str:
    if metric == "clip_similarity":
        return f"{m.value:.3f} [{m.low:.3f}, {m.high:.3f}]"
    return f"{100 * m.value:.1f} [{100 * m.low:.1f}, {100 * m.high:.1f}]"


def _metric_names(rows: Sequence[LeaderboardRow]) -> list[str]:
    present = {k for r in rows for k in r.metrics}
    return [k for k in METRIC_LABELS if k in present] + sorted(present - set(METRIC_LABELS))


def _behaviour_cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key in ("asked_before_answering", "answered_without_asking", "simulator_dont_know_rate", "answer_parses"):
        return f"{100 * value:.0f}%"
    if isinstance(value, float):
        return f"{value:.1f}" if key == "mean_agent_reply_chars" else f"{value:.2f}"
    return str(value)


def leaderboard_markdown(rows: Sequence[LeaderboardRow]) -> str:
    """A Markdown table: metrics as value [95% CI] (percent, except CLIP cosine)."""
    metrics = _metric_names(rows)
    head = ["agent", "tasks", "episodes"] + [METRIC_LABELS.get(m, m) for m in metrics] \
        + list(BEHAVIOUR_LABELS.values())
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = r.agent + (" (baseline)" if r.baseline else "")
        cells = [name, str(r.n_tasks), str(r.n_episodes)]
        cells += [_pct(r.metrics[m], m) if m in r.metrics else "" for m in metrics]
        cells += [_behaviour_cell(k, r.behaviour.get(k)) for k in BEHAVIOUR_LABELS]
        lines.append("| " + " | ".join(cells) + " |")
    note = "Metrics: value [95% bootstrap CI over tasks], percent except CLIP similarity (cosine)."
    versions = sorted({r.scoring_version for r in rows if r.scoring_version is not None})
    if versions:
        note += f" Scoring version {', '.join(map(str, versions))}."
    errors = [_engine_errors_line(r) for r in rows if r.behaviour.get("engine_errors")]
    unusable = unusable_lines(rows)
    return ("\n".join(lines) + "\n\n" + note + "\n" + "".join(f"\n{e}\n" for e in errors + _prompt_lines(rows))
            + ("\n" + "\n".join(unusable) + "\n" if unusable else ""))


def _prompt_lines(rows: Sequence[LeaderboardRow]) -> list[str]:
    """`Prompts: agent <path> (sha256 <12 hex>); human ...` for each distinct set of files."""
    lines: list[str] = []
    for r in rows:
        if not r.prompts:
            continue
        files = "; ".join(f"{role} " + ", ".join(f"{rec['path']} (sha256 {rec['sha256'][:12]})" for rec in recs)
                          for role, recs in r.prompts.items())
        line = f"Prompts: {files}"
        if line not in lines:
            lines.append(line)
    return lines


def _engine_errors_line(row: LeaderboardRow) -> str:
    """`Engine errors: agent: 3 of 8 episodes failed (scored 0); first: <reason>`."""
    first = " ".join(str(row.behaviour.get("first_engine_error") or "").split())
    if len(first) > FIRST_ERROR_CHARS:
        first = first[: FIRST_ERROR_CHARS - 3] + "..."
    return (f"Engine errors: {row.agent}: {row.behaviour['engine_errors']} of {row.n_episodes} episodes failed "
            f"(scored 0); first: {first}")


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plot_metrics(rows: Sequence[LeaderboardRow]) -> str:
    """Bar chart per metric with 95% CI error bars; returns base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = _metric_names(rows)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics) + 1, 3.2), squeeze=False)
    names = [r.agent for r in rows]
    for ax, m in zip(axes[0], metrics):
        vals = [r.metrics[m].value if m in r.metrics else 0.0 for r in rows]
        lo = [max(0.0, v - r.metrics[m].low) if m in r.metrics else 0.0 for v, r in zip(vals, rows)]
        hi = [max(0.0, r.metrics[m].high - v) if m in r.metrics else 0.0 for v, r in zip(vals, rows)]
        ax.bar(range(len(rows)), vals, yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(METRIC_LABELS.get(m, m))
        ax.set_ylim(0, max(1.0, max(vals, default=0) * 1.1))
    return _png(fig)


def plot_counts(episodes_by_agent: dict[str, Sequence[Episode]], count: Callable[[Episode], int],
                title: str, xlabel: str) -> str:
    """Grouped histogram of an integer per episode (turns used, questions asked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = list(episodes_by_agent)
    values = {a: [count(ep) for ep in eps] for a, eps in episodes_by_agent.items()}
    top = max([max(v, default=0) for v in values.values()], default=0)
    xs = list(range(top + 1))
    width = 0.8 / max(1, len(agents))
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for i, a in enumerate(agents):
        n = max(1, len(values[a]))
        ax.bar([x + i * width for x in xs], [values[a].count(x) / n for x in xs], width=width, label=a)
    ax.set_xticks([x + width * (len(agents) - 1) / 2 for x in xs], [str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of episodes")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)


def _open_png(path: Any) -> Any:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            return im.crop((0, 0, im.width, min(im.height, int(im.width * 1.25))))  # the top of long pages
    except (OSError, ValueError, TypeError):
        return None


def thumbnails(tasks: Sequence[Task], episodes_by_agent: dict[str, Sequence[Episode]], n_tasks: int = 4) -> str | None:
    """Frontend: a grid, one row per task: the target page, then each agent's final
    page (lowest seed), from the screenshots scoring saved (Score.detail "target_png",
    "answer_png"). None when there is no screenshot at all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = list(episodes_by_agent)
    first = {a: {} for a in agents}  # agent -> task_id -> episode of the lowest seed
    for a, eps in episodes_by_agent.items():
        for ep in sorted(eps, key=lambda e: e.seed, reverse=True):
            first[a][ep.task_id] = ep
    tasks = list(tasks)[:n_tasks]
    grid = []
    for t in tasks:
        eps = [first[a].get(t.task_id) for a in agents]
        details = [ep.score.detail if ep and ep.score else {} for ep in eps]
        target = next((d["target_png"] for d in details if d.get("target_png")), None)
        grid.append([_open_png(target) if target else None]
                    + [_open_png(d["answer_png"]) if d.get("answer_png") else None for d in details])
    if not any(img is not None for row in grid for img in row):
        return None
    fig, axes = plt.subplots(len(tasks), 1 + len(agents), figsize=(2.4 * (1 + len(agents)), 2.8 * len(tasks)),
                             squeeze=False)
    for i, (t, row) in enumerate(zip(tasks, grid)):
        for j, (ax, img) in enumerate(zip(axes[i], row)):
            if img is not None:
                ax.imshow(img)
            else:
                ax.text(0.5, 0.5, "no render", ha="center", va="center")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title("target" if j == 0 else agents[j - 1], fontsize=8)
        axes[i][0].set_ylabel(t.task_id[:20], fontsize=7)
    return _png(fig)


def _table_html(md: str) -> str:
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    out = ["<table>"]
    for i, ln in enumerate(lines):
        if i == 1:
            continue
        tag = "th" if i == 0 else "td"
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out.append("<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def _dialogue_html(ep: Episode) -> str:
    parts = [f"<details><summary>{html.escape(ep.episode_id)}: reward {ep.reward:.2f}, "
             f"{html.escape(ep.stop_reason)}, {len(ep.agent_turns)} turns</summary>"]
    for t in ep.turns:
        who = "agent" if t.role == "agent" else "human"
        text = t.content if not t.failed else f"[failed: {t.error}]"
        parts.append(f"<p class='{who}'><b>{who}</b><pre>{html.escape(text[:2000])}</pre></p>")
    return "\n".join(parts + ["</details>"])


def report_html(rows: Sequence[LeaderboardRow], episodes_by_agent: dict[str, Sequence[Episode]], *, env: str,
                config: dict[str, Any] | None = None, thumbs: str | None = None) -> str:
    """The whole report as one HTML string."""
    imgs = [("Metrics (95% CI)", plot_metrics(rows)),
            ("Agent turns used", plot_counts(episodes_by_agent, lambda e: len(e.agent_turns),
                                             "Turns used", "agent turns")),
            ("Questions asked", plot_counts(episodes_by_agent, lambda e: sum(t.role == "human" for t in e.turns),
                                            "Questions asked before answering", "questions"))]
    if thumbs:
        imgs.append(("Final renders next to targets", thumbs))
    body = [f"<h1>ColBench {html.escape(env)} evaluation</h1>", _table_html(leaderboard_markdown(rows)),
            "<p>Metrics: value [95% bootstrap CI over tasks]; percent except CLIP similarity. Scoring version "
            + html.escape(", ".join(sorted({str(r.scoring_version) for r in rows}))) + ".</p>"]
    body += [f"<p class='error'>{html.escape(_engine_errors_line(r))}</p>" for r in rows
             if r.behaviour.get("engine_errors")]
    unusable = unusable_lines(rows)
    if unusable:
        body.append(f"<h2>Unusable tasks</h2><p class='error'>{html.escape(unusable[0])}</p><ul>"
                    + "".join(f"<li>{html.escape(u[2:])}</li>" for u in unusable[1:]) + "</ul>")
    for title, b64 in imgs:
        body.append(f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' "
                    f"src='data:image/png;base64,{b64}'>")
    body.append("<h2>Stop reasons</h2><ul>" + "".join(
        f"<li>{html.escape(r.agent)}: {html.escape(json.dumps(r.behaviour.get('stop_reasons', {})))}</li>"
        for r in rows) + "</ul>")
    body.append("<h2>Example dialogues</h2>")
    for agent, eps in episodes_by_agent.items():
        body.append(f"<h3>{html.escape(agent)}</h3>" + "\n".join(_dialogue_html(ep) for ep in list(eps)[:3]))
    if config:
        body.append("<h2>Config</h2><pre>" + html.escape(json.dumps(config, indent=2)) + "</pre>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}pre{white-space:pre-wrap;margin:2px}"
             "img{max-width:100%}.human{color:#345}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ColBench {html.escape(env)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_reports(out_dir: Path, rows: Sequence[LeaderboardRow], episodes_by_agent: dict[str, Sequence[Episode]],
                  *, env: str, config: dict[str, Any] | None = None, thumbs: str | None = None) -> None:
    """Write leaderboard.json, leaderboard.md and report.html into out_dir."""
    out_dir = Path(out_dir)
    atomic_write(out_dir / "leaderboard.json", json.dumps([r.to_json() for r in rows], indent=2) + "\n")
    atomic_write(out_dir / "leaderboard.md", leaderboard_markdown(rows))
    atomic_write(out_dir / "report.html", report_html(rows, episodes_by_agent, env=env, config=config, thumbs=thumbs))
