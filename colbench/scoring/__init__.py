"""How answers are scored, never in our process.

    sandbox.py, _sandbox_child.py   run untrusted Python (answers, references) isolated
    backend.py                      backend programming: run the tests, compare outputs
    render.py                       headless-chromium render pool (screenshots, structure)
    routing.py                      what a rendered page's requests are answered with
    tailwind.py                     vendored Tailwind and its per-page purge
    placeholders.py                 generated placeholder images
    clip.py                         frontend reward: CLIP cosine similarity of renders
"""
