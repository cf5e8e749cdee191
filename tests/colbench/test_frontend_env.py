"""FrontendEnv: prompts, answer extraction, and CLIP scoring of real renders (tiny CLIP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from colbench.envs import make_env
from colbench.envs.frontend import NO_DRAFT, FrontendEnv, extract_html, has_html
from colbench.protocols import Environment
from colbench.scoring.render import DEFAULT_CHROMIUM
from colbench.types import Task, Turn

TW = '<link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">'
TARGET = (f"<html><head>{TW}</head><body><header class='bg-blue-700 text-white p-8 text-4xl'>Acme Bakery</header>"
          "<img src='https://picsum.photos/600/300' class='mx-auto my-8'><p class='p-8'>Fresh bread daily.</p></body></html>")
TASK = Task("fe-1", "frontend", "A bakery homepage.", TARGET)
needs_chromium = pytest.mark.skipif(not Path(DEFAULT_CHROMIUM).exists(), reason="chromium not installed")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = FrontendEnv(clip_model="tiny", render_dir=tmp_path_factory.mktemp("renders"), render_timeout_s=6.0)
    yield e
    e.close()


def test_registry_builds_frontend_env_satisfying_the_contract():
    e = make_env("frontend", clip_model="tiny")
    assert isinstance(e, Environment) and e.name == "frontend" and e.max_turns == 10
    assert e.answer_marker == "I WANT TO ANSWER:"
    e.close()


def test_agent_messages_have_instructions_description_and_dialogue(env):
    turns = [Turn("agent", "```html\n<div>v1</div>\n```"), Turn("human", "The header should be blue.")]
    msgs = env.agent_messages(TASK, turns)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    system = msgs[0]["content"]
    assert "Tailwind" in system and "I WANT TO ANSWER:" in system and "10 turns" in system and "{" not in system
    assert msgs[1]["content"] == TASK.description and msgs[3]["content"] == "The header should be blue."
    assert TARGET not in str(msgs)  # the hidden page never reaches the agent
    single = env.agent_messages(TASK, [], single_turn=True)[0]["content"]
    assert "single turn" in single and "at most 1 turns" in single


@pytest.mark.parametrize(
    "text, html",
    [
        ("Here:\n```html\n<div>a</div>\n```\nthanks", "<div>a</div>"),
        ("```HTML\n<p>x</p>```", "<p>x</p>"),
        ("```\n<section>s</section>\n```", "<section>s</section>"),
        ("```python\nprint(1)\n```\n```html\n<b>2</b>\n```", "<b>2</b>"),
        ("intro <!DOCTYPE html><html><body>x</body></html> outro", "<!DOCTYPE html><html><body>x</body></html>"),
        ("<html><body>unterminated", "<html><body>unterminated"),
        ("```html\n<div>cut off by the token limit", "<div>cut off by the token limit"),
        ("  <div>bare</div>  ", "<div>bare</div>"),
        ("Thanks! <body class='x'><h1>hi</h1></body> done", "<body class='x'><h1>hi</h1></body>"),
        ("What colour should the header be?", ""),  # prose is never a draft
        ("```python\nprint(1)\n```", ""),
        ("Use a <div> for the header, right?", ""),
    ],
)
def test_extract_html(text, html):
    assert extract_html(text) == html


def test_final_answer_extraction(env):
    final = "Great, thanks!\nI WANT TO ANSWER:\n```html\n<html><body>final</body></html>\n```"
    assert env.is_final(final) and not env.is_final("```html\n<div>draft</div>\n```")
    assert env.extract_answer(final) == "<html><body>final</body></html>"
    # turn limit reached: no marker, the message's HTML is the answer
    assert env.extract_answer("```html\n<div>draft</div>\n```") == "<div>draft</div>"
    assert env.extract_answer("```html\n<p>v1</p>\n```\nI WANT TO ANSWER: the page above") == "<p>v1</p>"
    assert env.extract_answer("I WANT TO ANSWER: as discussed") == ""
    assert has_html(final) and not has_html("What colour should the header be?")
    assert env.training_info(TASK) == TARGET


@needs_chromium
def test_score_rewards_the_target_most_and_records_renders(env):
    near = TARGET.replace("Fresh bread daily.", "Fresh bread every day.")
    far = "<html><body style='background:#111'><h1 style='color:lime;font-size:90px'>Totally different</h1></body></html>"
    hostile = "<script>while(true){}</script>"
    scores = env.score([TASK] * 5, [TARGET, near, far, hostile, "   "])
    exact, close, other, hung, empty = scores
    assert exact.error is None and exact.reward == pytest.approx(1.0, abs=1e-5) and exact.success
    assert close.error is None and other.error is None
    assert exact.reward >= close.reward > other.reward
    assert Path(exact.detail["answer_png"]).is_file() and Path(exact.detail["target_png"]).is_file()
    assert exact.detail["answer_html_chars"] == len(TARGET)
    assert Path(exact.detail["target_png"]).parent.name == "targets"
    assert hung.reward == 0.0 and not hung.success and "timed out" in hung.error
    assert empty.reward == 0.0 and empty.error == NO_DRAFT
    # the target is rendered and embedded once per task, then reused
    assert len(env._targets) == 1
    again = env.score([TASK], [far])[0]
    assert again.reward == pytest.approx(other.reward, abs=1e-6)


@needs_chromium
def test_score_iter_scores_a_chunk_before_rendering_the_next(tmp_path):
    """score_iter yields each chunk's scores before it renders the next chunk (the runner
    saves them at once), in order, with the same rewards as one `score` call."""
    pages = [TARGET, TARGET.replace("Acme", "Apex"), TARGET.replace("bg-blue-700", "bg-red-700"),
             "<html><body><h1>other</h1></body></html>", TARGET.replace("Fresh", "Warm")]
    tasks = [Task(f"fe-{i}", "frontend", "A bakery homepage.", TARGET) for i in range(len(pages))]
    e = FrontendEnv(clip_model="tiny", render_dir=tmp_path, render_timeout_s=6.0, score_chunk=2)
    try:
        it = e.score_iter(tasks, pages)
        first = next(it)
        assert first[0] == 0 and len(list((tmp_path / "answers").glob("*.png"))) == 2
        got = [first, *it]
        assert [i for i, _ in got] == list(range(len(pages)))
        whole = e.score(tasks, pages)
        assert [sc.reward for _, sc in got] == pytest.approx([sc.reward for sc in whole], abs=1e-6)
        assert got[0][1].reward == pytest.approx(1.0, abs=1e-5)
    finally:
        e.close()
    with pytest.raises(ValueError, match="score_chunk"):
        FrontendEnv(clip_model="tiny", score_chunk=0)


@needs_chromium
def test_success_threshold_is_configurable(tmp_path):
    e = FrontendEnv(clip_model="tiny", render_dir=tmp_path, success_threshold=1.0)
    try:
        far = "<html><body><h1>other</h1></body></html>"
        s = e.score([TASK], [far])[0]
        assert s.error is None and s.reward < 1.0 and not s.success
    finally:
        e.close()


def test_the_answer_is_the_last_draft_of_any_turn(env):
    """As the published environment scores its last rendered draft: a final message without
    HTML leaves the last draft as the answer, and the episode says which turn that was."""
    a = lambda text: Turn("agent", text)  # noqa: E731
    h = lambda text: Turn("human", text)  # noqa: E731
    turns = [a("```html\n<p>v1</p>\n```"), h("Bigger."), a("```html\n<p>v2</p>\n```"), h("Good."),
             a("Should the footer be grey?"), h("Yes."), a("I WANT TO ANSWER: the page above.")]
    assert (env.episode_answer(TASK, turns), env.answer_turn(TASK, turns)) == ("<p>v2</p>", 1)
    assert env.answer_turn(TASK, turns[:1]) == 0
    prose = [a("What is the site for?"), h("A bakery."), a("I WANT TO ANSWER: a bakery page.")]
    assert (env.episode_answer(TASK, prose), env.answer_turn(TASK, prose)) == ("", None)


class _Script:
    """An agent that says its scripted messages in order (the same for every episode)."""

    name = "script"
    needs_simulator = True

    def __init__(self, texts):
        self.texts = texts

    def act(self, requests):
        from engines.base import Sample

        return [Sample(self.texts[sum(m["role"] == "assistant" for m in r.messages)]) for r in requests]


@needs_chromium
def test_the_runner_scores_the_last_draft_and_a_draftless_episode_scores_0(tmp_path):
    from colbench.rollout import rollout
    from simulators import load_simulator

    e = FrontendEnv(clip_model="tiny", render_dir=tmp_path, render_timeout_s=20.0)
    try:
        sim = load_simulator("scripted:idk", e)
        drafted = rollout(e, [TASK], _Script([f"```html\n{TARGET}\n```", "Anything else?",
                                              "I WANT TO ANSWER: the page I showed you."]), sim)[0]
        prose = rollout(e, [TASK], _Script(["What should it say?", "I WANT TO ANSWER: a bakery page."]), sim)[0]
    finally:
        e.close()
    assert drafted.answer == TARGET and drafted.meta["answer_turn"] == 0 and drafted.score.error is None
    assert drafted.score.detail["answer_html_chars"] == len(TARGET)  # the draft was rendered, not the last message
    assert prose.answer == "" and prose.meta["answer_turn"] is None
    assert prose.reward == 0.0 and prose.score.error == NO_DRAFT and prose.score.detail["answer_png"] is None
    assert drafted.meta["scoring_version"] == prose.meta["scoring_version"] == FrontendEnv.scoring_version


def test_each_environment_has_its_scoring_version_and_reply_cap():
    from colbench.envs import reply_cap
    from colbench.episodes import current_scoring_version
    from colbench.scoring.backend import SCORING_VERSION

    from colbench.envs.backend import BackendEnv

    # the test bed scores as backend does (TestbedEnv is a BackendEnv)
    assert current_scoring_version("backend") == current_scoring_version("testbed") == BackendEnv.scoring_version
    assert BackendEnv.scoring_version == SCORING_VERSION + 1
    assert current_scoring_version("frontend") == FrontendEnv.scoring_version != SCORING_VERSION
    # published: 1,000 characters for frontend (human_design_interaction_env.py), 400 for backend
    assert (reply_cap("frontend"), reply_cap("backend"), reply_cap("testbed")) == (1000, 400, 400)
    assert reply_cap("frontend", 50) == 50
