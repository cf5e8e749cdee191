#!/usr/bin/env bash
# Set up (idempotent) and run the default test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
# Two pytest-xdist workers (the 2-core machines CI and the README assume; SWEET_TEST_WORKERS=N
# for more, 0 for one process): each runs one torch thread (tests/conftest.py). A later -n wins.
.venv/bin/python -m pytest -q -n "${SWEET_TEST_WORKERS:-2}" "$@"
