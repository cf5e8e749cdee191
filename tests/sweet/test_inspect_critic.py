"""`python -m sweet.critic.inspect`: a trained tiny critic's per-turn advantages on an
HTML page, with stage-2 candidates ranked, and untrusted dialogue text escaped."""

import json
import re

import pytest

from colbench.types import Episode

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HOSTILE = "<script>alert('x')</script><img src=http://evil/x.png>"


@pytest.fixture(scope="module")
def critic_dir(tmp_path_factory, synthetic_files):
    from accelerate.state import AcceleratorState, GradientState

    from sweet.critic.train import cli

    episodes, tasks = synthetic_files
    out = tmp_path_factory.mktemp("inspect") / "critic"
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    cli(["--episodes", str(episodes), "--tasks", str(tasks), "--output_dir", str(out), "--num_epochs", "1",
         "--batch_size", "4", "--micro_batch_size", "4", "--learning_rate", "2e-3", "--max_pairs", "8",
         "--max_length", "512", "--report_to", "none"])
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return out


def _row(episode, scored):
    """A candidates.jsonl row (the stage-2 writer's record) for the episode's first state."""
    from sweet.core.records import CandidatesRow, SampledAction

    return CandidatesRow(f"{episode.episode_id}#0", episode.task_id, episode.episode_id, 0, None,
                         tuple(SampledAction(text, (1, 2), None, "stop", adv) for text, adv in scored)).to_json()


def test_page_shows_each_turns_advantage_ranked_candidates_and_escapes_text(critic_dir, synthetic_files, tmp_path):
    from sweet.core.records import episode_states, load_episodes
    from sweet.critic import inspect as inspect_critic
    from sweet.critic.model import TrainedCritic, load_training_info

    episodes_path, tasks = synthetic_files
    episodes = load_episodes(episodes_path, env="backend")[:4]
    # dialogue text is untrusted: a hostile agent message (its recorded ids are what the critic scores)
    hostile = Episode.from_json(episodes[0].to_json())
    hostile.turns[0].content = HOSTILE
    episodes[0] = hostile
    ep_file = tmp_path / "episodes.jsonl"
    ep_file.write_text("".join(json.dumps(e.to_json()) + "\n" for e in episodes))
    # a stage-2 row for the second episode's first state, scores deliberately unsorted
    cand_file = tmp_path / "candidates.jsonl"
    cand_file.write_text(json.dumps(_row(episodes[1], [("middle candidate", 0.1), ("best candidate", 0.7),
                                                       ("worst <b>candidate</b>", -0.4)])) + "\n")

    page = inspect_critic.cli(["--critic", str(critic_dir), "--episodes", str(ep_file), "--output",
                                str(tmp_path / "out"), "--candidates", str(cand_file), "--tasks", str(tasks)])
    html = page.read_text()

    # one advantage per agent turn, equal to the scorer's own A(o_t, a_t, c)
    shown = [float(x) for x in re.findall(r"A = ([+-]\d+\.\d+)", html)]
    scorer = TrainedCritic.load(critic_dir, device="cpu")
    info = load_training_info(str(tasks), env="backend")
    expected = []
    for ep in inspect_critic.pick_episodes(episodes, {(episodes[1].episode_id, 0): []}, 60):
        for state, turn in zip(episode_states(ep, info[ep.task_id]), ep.agent_turns):
            expected.append(scorer.advantages(state, [turn.token_ids])[0])
    assert len(shown) == sum(len(ep.agent_turns) for ep in episodes) == len(expected)
    assert shown == pytest.approx(expected, abs=6e-4)
    assert any(abs(a) > 1e-3 for a in expected)  # the trained critic is not π_ref
    # the staged episode comes first and its candidates are ranked best first
    assert html.index("best candidate") < html.index("middle candidate") < html.index("worst &lt;b&gt;candidate")
    assert html.index(episodes[1].episode_id) < html.index(episodes[0].episode_id)
    # nothing the model wrote becomes markup, and the page loads nothing
    assert HOSTILE not in html and "<script" not in html and "&lt;script&gt;" in html
    assert "<img" not in html and "<b>candidate" not in html
    for ep in episodes:
        assert f"reward {ep.reward:.2f}" in html


def test_bad_candidates_file_names_the_line(critic_dir, synthetic_files, tmp_path):
    from sweet.core.records import load_episodes
    from sweet.critic import inspect as inspect_critic

    episodes_path, tasks = synthetic_files
    bad = tmp_path / "candidates.jsonl"
    episode = load_episodes(episodes_path, env="backend")[0]
    bad.write_text(json.dumps(_row(episode, [])) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"candidates.jsonl:2: not a candidates row"):
        inspect_critic.cli(["--critic", str(critic_dir), "--episodes", str(episodes_path), "--output",
                             str(tmp_path / "o"), "--candidates", str(bad), "--tasks", str(tasks)])
    with pytest.raises(ValueError, match="--critic is required"):
        inspect_critic.cli(["--episodes", str(episodes_path), "--output", str(tmp_path / "o")])


def _episode(seed: int, n_agent_turns: int):
    from colbench.types import Turn

    turns = []
    for k in range(n_agent_turns):
        turns += [Turn("agent", f"a{k}"), Turn("human", f"h{k}")]
    return Episode(task_id="t", env="testbed", agent="a", seed=seed, turns=turns[:-1])


def test_credit_split_sums_each_part_of_the_margin_and_leaves_out_unequal_lengths():
    from sweet.core.records import Pair
    from sweet.critic.inspect import credit_split

    eps = {name: _episode(i, n) for i, (name, n) in enumerate((("w1", 3), ("l1", 3), ("w2", 3), ("l2", 3), ("short", 1)))}
    adv = {eps["w1"].episode_id: [0.5, 0.0, -1.0], eps["l1"].episode_id: [0.0, 0.0, -4.0],   # answer decides
           eps["w2"].episode_id: [0.0, 0.0, -2.0], eps["l2"].episode_id: [1.0, 0.5, -3.0],   # questions disagree
           eps["short"].episode_id: [-9.0]}
    pairs = [Pair(eps["w1"], eps["l1"], "t"), Pair(eps["w2"], eps["l2"], "t"), Pair(eps["w1"], eps["short"], "t")]
    split = credit_split(pairs, adv)
    assert split.pairs == 2  # the pair with the one-turn episode is left out
    # pair 1: earlier 0.5 - 0 = +0.5, last -1 - -4 = +3; pair 2: earlier 0 - 1.5 = -1.5, last -2 - -3 = +1
    assert split.earlier == pytest.approx((0.5 - 1.5) / 2) and split.last == pytest.approx((3 + 1) / 2)
    assert split.ordered_by_earlier == 0.5 and split.ordered_by_last == 1.0
    assert split.last_share == pytest.approx(2.0 / 1.5)
    assert "2 trajectory pairs of equal length" in split.line()
    with pytest.raises(ValueError, match="no pairs"):
        credit_split([Pair(eps["w1"], eps["short"], "t")], adv)


def test_inspector_writes_the_credit_split_of_the_critics_pairs(critic_dir, synthetic_files, tmp_path):
    from sweet.core.records import load_episodes
    from sweet.critic import inspect as inspect_critic
    from sweet.critic.model import TrainedCritic, load_training_info

    episodes_path, tasks = synthetic_files
    inspect_critic.cli(["--critic", str(critic_dir), "--episodes", str(episodes_path), "--output",
                        str(tmp_path / "out"), "--tasks", str(tasks), "--max_episodes", "2"])
    episodes = load_episodes(episodes_path, env="backend")
    pairs = [p for p in inspect_critic.training_pairs(str(critic_dir), episodes)
             if len(p.chosen.agent_turns) == len(p.rejected.agent_turns)]
    assert pairs, "the synthetic episodes should give equal-length pairs"
    written = json.loads((tmp_path / "out" / "credit_split.json").read_text())
    scorer = TrainedCritic.load(critic_dir, device="cpu")
    info = load_training_info(str(tasks), env="backend")
    paired = list({id(e): e for p in pairs for e in (p.chosen, p.rejected)}.values())
    advs = {ep.episode_id: a for ep, a in zip(paired, inspect_critic.score_episodes(scorer, paired, info))}
    expected = inspect_critic.credit_split(pairs, advs)
    assert written["pairs"] == len(pairs) == expected.pairs
    assert written["last"] == pytest.approx(expected.last, abs=1e-3)
    assert written["earlier"] == pytest.approx(expected.earlier, abs=1e-3)
