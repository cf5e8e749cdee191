"""The frontend's vision-language critic (sweet/critic/vision.py) on the tiny Qwen2-VL
(`tiny-vl`, built locally): it trains on both heads from the CLI, its update does not change
with the micro-batch size or the process count, it reads the pixels (its score moves when only
the draft's screenshot changes), stage 2 ranks with it, and each page is rendered once.
Nothing here rests on the tiny CLIP: the critic never uses it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweet.critic.train import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
FILES = {"lm": ["model.safetensors"], "value": ["model.safetensors", "value_head.safetensors"]}


def _args(episodes, tasks, out, head: str, *extra) -> list[str]:
    return ["--critic_model", "tiny-vl", "--env", "frontend", "--head", head, "--episodes", str(episodes), "--tasks",
            str(tasks), "--output_dir", str(out), "--num_epochs", "1", "--batch_size", "4", "--micro_batch_size", "2",
            "--learning_rate", "2e-3", "--eval_fraction", "0", "--max_length", "1024", "--report_to", "none",
            "--dtype", "float32", *extra]


def _weights(final: Path, head: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {f"{f}:{k}": v for f in FILES[head] for k, v in load_file(str(final / f)).items()}


@pytest.fixture(scope="module")
def vl_critics(tmp_path_factory, frontend_files):
    """One in-process 2-epoch run per head on 8 frontend tasks (8 pairs)."""
    from accelerate.state import AcceleratorState, GradientState

    runs = {}
    for head in ("lm", "value"):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        out = tmp_path_factory.mktemp("vl") / head
        metrics = cli(_args(*frontend_files, out, head, "--num_epochs", "2"))
        runs[head] = (out, metrics)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return runs


def test_tiny_vl_is_built_locally_with_the_vision_tokens():
    from transformers import AutoProcessor

    from engines.tiny import VL_MAX_PIXELS, tiny_vl_path
    from sweet.core.models import is_vision_model

    path = tiny_vl_path()
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl" and config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    processor = AutoProcessor.from_pretrained(path)
    assert processor.image_processor.size["longest_edge"] == VL_MAX_PIXELS == 64 * 28 * 28
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == config["image_token_id"]
    assert is_vision_model("tiny-vl") and not is_vision_model("tiny")


def test_screenshots_enter_as_the_processor_would_put_them(tmp_path):
    """Our context ids expand each image slot to as many tokens as Qwen2-VL's processor does for
    the same screenshot, and the pixel values are the processor's; the agent's text cannot open
    an image slot."""
    from colbench.scoring.render import RenderCache
    from sweet.core.records import State
    from sweet.critic.vision import IMAGE_PAD, ScreenshotView, load_processor
    from frontend_fixtures import frontend_page

    processor = load_processor("tiny-vl")
    view = ScreenshotView(processor, RenderCache(tmp_path / "renders"))
    prompt = ({"role": "system", "content": f"Design it. Ignore {IMAGE_PAD}."}, {"role": "user", "content": "A shop."})
    state = State("t", "e", 0, prompt, None, frontend_page("#c62828"))
    draft = f"```html\n{frontend_page('#1565c0', 'Draft')}\n```"
    ids, images = view.context(state, view.action_ids(draft, "stop"), "Training-time information", True, None)
    assert len(images) == 2  # the target, then the draft
    pictures = [r.image for r in view.renders.render([state.training_info, frontend_page("#1565c0", "Draft")])]
    theirs = processor(text=["x" + IMAGE_PAD + "y" + IMAGE_PAD], images=pictures, return_tensors="pt")
    assert ids.count(view.image_token_id) == int((theirs["input_ids"] == view.image_token_id).sum())
    assert torch.equal(torch.cat([p for p, _ in images]), theirs["pixel_values"])
    assert torch.equal(torch.cat([g for _, g in images]), theirs["image_grid_thw"])
    # the published size bound: at most 64 merged tokens per screenshot
    assert all(int(g.prod()) // 4 <= 64 for _, g in images)
    smaller = ScreenshotView(processor, view.renders, max_pixels=16 * 28 * 28, min_pixels=4 * 28 * 28)
    small_ids, _ = smaller.context(state, view.action_ids(draft, "stop"), "Training-time information", True, None)
    assert small_ids.count(view.image_token_id) < ids.count(view.image_token_id)


def test_each_page_is_rendered_once(tmp_path):
    from colbench.scoring.render import RenderCache
    from frontend_fixtures import frontend_page

    a, b = frontend_page("#c62828"), frontend_page("#1565c0")
    cache = RenderCache(tmp_path)
    results = cache.render([a, b, a])
    assert cache.rendered == 2 and all(r.ok for r in results) and results[0] is results[2]
    cache.render([b, a])
    assert cache.rendered == 2
    cache.close()
    again = RenderCache(tmp_path)  # a later run reads the PNGs back
    assert [r.image.tobytes() for r in again.render([a, b])] == [r.image.tobytes() for r in results[:2]]
    assert again.rendered == 0


@pytest.mark.parametrize("head", ["lm", "value"])
def test_vl_critic_trains_from_the_cli(vl_critics, head):
    out, final = vl_critics[head]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    bt = [r["loss/bt"] for r in rows if "loss/bt" in r]
    assert bt[0] == pytest.approx(0.6931, abs=1e-3)  # θ = π_ref (lm) / a zero head (value): every A is 0
    assert bt[-1] < bt[0]
    record = json.loads((out / "critic_config.json").read_text())
    assert record["vision"] == {"max_pixels": 64 * 28 * 28, "min_pixels": 16 * 28 * 28} and record["head"] == head
    assert (out / "final" / "processor_config.json").exists()
    assert len(list((out / "renders").glob("*.png"))) == 4  # 2 targets (also the answers), 2 drafts: once each


@pytest.mark.parametrize("head", ["lm", "value"])
def test_score_moves_with_the_draft_screenshot_alone(vl_critics, frontend_files, tmp_path, head):
    """The same state and the same action text, scored with the draft's screenshot swapped for
    another page's (the render cache's PNG under the draft's key): the critic's score changes;
    with the same screenshots it is reproduced exactly."""
    from colbench.episodes import load_episodes
    from colbench.scoring.render import RenderCache
    from sweet.core.records import episode_states
    from sweet.critic.model import TrainedCritic
    from frontend_fixtures import frontend_page

    out, _ = vl_critics[head]
    episode = load_episodes(str(frontend_files[0]), env="frontend")[0]
    tasks = {json.loads(line)["task_id"]: json.loads(line) for line in frontend_files[1].read_text().splitlines()}
    state = episode_states(episode, tasks[episode.task_id]["hidden"])[0]
    turn = episode.agent_turns[0]
    same, swapped = tmp_path / "same", tmp_path / "swapped"
    shutil.copytree(out / "renders", same)
    shutil.copytree(out / "renders", swapped)
    draft_html = next(h for h in (frontend_page(c, "Draft") for c in ("#c62828", "#1565c0")) if h in turn.content)
    other = frontend_page("#2e7d32", "Elsewhere")
    RenderCache(swapped).render([other])
    shutil.copy(swapped / f"{RenderCache.key(other)}.png", swapped / f"{RenderCache.key(draft_html)}.png")

    scores = {}
    for name, folder in (("original", out / "renders"), ("same", same), ("swapped", swapped)):
        critic = TrainedCritic.load(out, device="cpu", render_dir=folder)
        [scores[name]] = critic.advantages(state, [list(turn.token_ids)], [turn.finish_reason])
        assert critic.view.renders.rendered == 0  # every page came from the cache
    assert scores["same"] == scores["original"]
    assert abs(scores["swapped"] - scores["original"]) > 1e-4 * max(1.0, abs(scores["original"]))


@pytest.mark.parametrize("head", ["lm", "value"])
def test_micro_batch_size_does_not_change_the_vl_update(tmp_path, frontend_files, fresh_accelerate, head):
    """One optimiser step of 4 pairs as 4 micro-batches of 1 or 1 of 4: the same weights
    (as tests/sweet/test_train_critic.py checks for the text critic).

    Adam's first step moves each weight by lr·g/(|g| + ε), ε = 1e-8: ±lr wherever |g| >> ε.
    Some gradients fall near or below ε: LM-head rows of tokens the data never shows, and a
    few of the vision tower's patch-embedding weights (measured: 2 of 37,632 at |g| ~ 2e-9,
    where the two summation orders differ by 2e-9, moving Adam's update there by 0.1·lr).
    An error δg in g moves the update by lr·δg·ε/(|g| + ε)²: the weights with |Δ| < 0.99·lr
    (|g| < 99ε; measured 2.4% of the LM-head run's, mostly LM-head rows; fewer on the value
    head) are compared as a whole (cosine), every other weight to 1e-6 (there δg = 2e-9 moves
    Δ by at most 4e-8)."""
    from engines.tiny import tiny_vl_path

    lr = 2e-3
    runs = {}
    for micro in (1, 4):
        args = _args(*frontend_files, tmp_path / f"micro{micro}", head, "--max_pairs", "4")
        args[args.index("--micro_batch_size") + 1] = str(micro)
        cli(args)
        runs[micro] = _weights(tmp_path / f"micro{micro}" / "final", head)
    before = _weights(tiny_vl_path(), "lm")
    start = {**before, **{k: torch.zeros_like(v) for k, v in runs[1].items() if k not in before}}
    delta1 = torch.cat([(runs[1][k] - start[k]).flatten() for k in runs[1]])
    delta4 = torch.cat([(runs[4][k] - start[k]).flatten() for k in runs[1]])
    assert delta1.norm() > 1e-3  # the step really moved the weights
    below_eps = (delta1 != 0) & (delta1.abs() < 0.99 * lr)
    assert below_eps.sum() <= 0.05 * delta1.numel()
    assert torch.equal(delta1 == 0, delta4 == 0)  # the same weights moved
    assert torch.allclose(delta1[~below_eps], delta4[~below_eps], atol=1e-6)
    assert torch.nn.functional.cosine_similarity(delta1, delta4, dim=0).item() > 0.99999


@pytest.mark.heavy
@pytest.mark.parametrize("head,port", [("lm", 29661), ("value", 29663)])
def test_two_cpu_processes_match_one_vl(tmp_path, frontend_files, fresh_accelerate, head, port):
    """2 DDP processes over gloo give the weights and metrics of 1 (the pages rendered once,
    by the main process)."""
    flags = ["--max_pairs", "8"]
    one = cli(_args(*frontend_files, tmp_path / "one", head, *flags))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "sweet/configs/ddp_cpu_2proc.yaml"), "--main_process_port", str(port), "-m", "sweet.train_critic",
           *_args(*frontend_files, tmp_path / "two", head, *flags)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "2 process(es) (MULTI_CPU)" in proc.stdout
    w1, w2 = _weights(tmp_path / "one" / "final", head), _weights(tmp_path / "two" / "final", head)
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)
    assert json.loads((tmp_path / "two" / "final_metrics.json").read_text()) == pytest.approx(one, abs=1e-4)


def test_vl_critic_needs_the_frontend(tmp_path, synthetic_files):
    with pytest.raises(ValueError, match="vision-language critic judges rendered pages: it needs --env frontend"):
        cli(["--model", "tiny-vl", "--episodes", str(synthetic_files[0]), "--tasks", str(synthetic_files[1]),
             "--output_dir", str(tmp_path / "x"), "--report_to", "none"])


def test_stage2_ranks_with_the_vl_critic(vl_critics, frontend_files, tmp_path):
    """`python -m sweet.train_policy --algorithm sweet` with the tiny policy and the tiny-vl
    critic: every state's candidates scored (the critic reads them as the policy's text),
    each distinct page rendered once into output_dir/critic_renders, a policy trained."""
    from sweet.algorithms.sweet_rl import CANDIDATES_FILE, CRITIC_RENDERS, read_candidates

    critic, _ = vl_critics["lm"]
    out = tmp_path / "sweet"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "sweet.train_policy", "--algorithm", "sweet", "--env", "frontend", "--episodes",
           str(frontend_files[0]), "--tasks", str(frontend_files[1]), "--critic", str(critic), "--output_dir", str(out),
           "--model", "tiny", "--dtype", "float32", "--report_to", "none", "--max_length", "1024",
           "--candidates_per_state", "3", "--max_new_tokens", "6", "--learning_rate", "1e-3", "--micro_batch_size", "8",
           "--episode_fraction", "0.25"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = read_candidates(out / CANDIDATES_FILE)
    assert rows and any(len({c.advantage for c in r.candidates}) > 1 for r in rows.values())
    assert (out / "final" / "config.json").exists()
    # the critic saw the targets and the earlier drafts (the tiny policy's candidates hold no page): once each
    names = sorted(p.name for p in (out / CRITIC_RENDERS).glob("*.png"))
    assert names and len(names) == len(set(names)) <= 4


def test_stage2_renders_each_candidate_page_once(vl_critics, frontend_files, tiny_tokenizer, tmp_path):
    """Candidates holding pages (ids in the policy's tokenizer): each distinct page is
    rendered once however many candidates show it, and equal candidates score equal."""
    from colbench.episodes import load_episodes
    from frontend_fixtures import frontend_page
    from sweet.core.records import episode_states
    from sweet.critic.model import TrainedCritic

    critic_dir, _ = vl_critics["value"]
    tasks = {json.loads(line)["task_id"]: json.loads(line) for line in frontend_files[1].read_text().splitlines()}
    episode = load_episodes(str(frontend_files[0]), env="frontend")[0]
    state = episode_states(episode, tasks[episode.task_id]["hidden"])[0]
    pages = [frontend_page(c, "Candidate") for c in ("#6a1b9a", "#ef6c00")]
    texts = [f"Draft:\n```html\n{pages[i]}\n```" for i in (0, 1, 0, 1, 0)]
    ids = [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    critic = TrainedCritic.load(critic_dir, device="cpu", action_tokenizer=tiny_tokenizer, render_dir=tmp_path)
    [scores] = critic.score_states([(state, ids, ["stop"] * len(ids))])
    assert critic.view.renders.rendered == 3  # the target and the two candidate pages
    assert scores[0] == scores[2] == scores[4] and scores[1] == scores[3] and scores[0] != scores[1]
    critic.score_states([(state, ids[:2], ["stop", "stop"])])
    assert critic.view.renders.rendered == 3


def test_inspector_shows_the_screenshot_beside_each_turn(vl_critics, frontend_files, tmp_path):
    """The credit page of a vision-language critic: the target's screenshot per episode and,
    beside each agent turn's credit, the draft it saw (checked by its colour: the draft's
    background, not any similarity score)."""
    import base64
    import io
    import re

    from PIL import Image

    from colbench.episodes import load_episodes
    from sweet.critic.inspect import cli as inspect_cli

    critic, _ = vl_critics["lm"]
    page = inspect_cli(["--critic", str(critic), "--episodes", str(frontend_files[0]), "--tasks",
                        str(frontend_files[1]), "--output", str(tmp_path / "inspect"), "--max_episodes", "2", "--device", "cpu"])
    text = page.read_text()
    shots = re.findall(r"<img class='shot' src='data:image/png;base64,([^']+)'", text)
    targets = re.findall(r"<img class='target' src='data:image/png;base64,([^']+)'", text)
    episodes = load_episodes(str(frontend_files[0]), env="frontend")[:2]
    assert len(targets) == 2 and len(shots) == sum(len(e.agent_turns) for e in episodes) == 4
    colour = lambda b64: Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB").getpixel((300, 180))  # noqa: E731
    for k, ep in enumerate(episodes):
        want = "#c62828" if "#c62828" in ep.agent_turns[0].content else "#1565c0"
        rgb = tuple(int(want[i:i + 2], 16) for i in (1, 3, 5))
        assert all(abs(a - b) <= 2 for a, b in zip(colour(shots[2 * k]), rgb))
    assert text.count("A = ") == 4
