"""Synthetic frontend critic data: each task's target is a page of one colour; per task the
chosen episode's draft and answer are in that colour, the rejected one's in the other."""

from __future__ import annotations

import random

from colbench.types import Episode, Score, Task, Turn


def _agent_turn(tokenizer, prompt: list[dict], text: str) -> Turn:
    from sweet.core.tokens import template_ids

    return Turn(role="agent", content=text, prompt=[dict(m) for m in prompt],
                prompt_token_ids=template_ids(tokenizer, prompt),
                token_ids=tokenizer(text, add_special_tokens=False)["input_ids"])


COLOURS = ("#c62828", "#1565c0")  # red, blue
FRONTEND_SYSTEM = "Design the page with the human: show drafts in ```html blocks, then write I WANT TO ANSWER:."


def frontend_page(colour: str, title: str = "Shop") -> str:
    return (f"<html><body style='margin:0;background:{colour}'><h1 style='color:white;font-size:64px'>{title}</h1>"
            "</body></html>")


def make_frontend_synthetic(tokenizer, n_tasks: int, seed: int = 0) -> tuple[list[Task], list[Episode]]:
    """n_tasks frontend tasks, each a page of one colour (its target, c); per task one
    episode whose draft and answer are in the target's colour (reward 0.9) and one in the
    other colour (reward 0.5). Each episode: a draft, a human reply, the final answer."""
    rng = random.Random(seed)
    tasks, episodes = [], []
    for k in range(n_tasks):
        colour = COLOURS[k % 2]
        task = Task(task_id=f"fe-{k:03d}", env="frontend", description="I want a page for my shop.",
                    hidden=frontend_page(colour))
        tasks.append(task)
        eps = []
        for s, (c, reward) in enumerate(((colour, 0.9), (COLOURS[1 - k % 2], 0.5))):
            prompt = [{"role": "system", "content": FRONTEND_SYSTEM}, {"role": "user", "content": task.description}]
            draft = f"Here is a draft:\n```html\n{frontend_page(c, 'Draft')}\n```"
            turns = [_agent_turn(tokenizer, prompt, draft), Turn(role="human", content="Make the title bigger.")]
            prompt = prompt + [{"role": "assistant", "content": draft}, {"role": "user", "content": turns[1].content}]
            answer = frontend_page(c)
            turns.append(_agent_turn(tokenizer, prompt, f"I WANT TO ANSWER:\n```html\n{answer}\n```"))
            eps.append(Episode(task_id=task.task_id, env="frontend", agent="synthetic", seed=s, turns=turns,
                               answer=answer, score=Score(reward=reward, success=reward >= 0.9),
                               stop_reason="answered"))
        rng.shuffle(eps)
        episodes.extend(eps)
    return tasks, episodes
