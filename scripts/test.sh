#!/usr/bin/env bash
# Set up (idempotent) and run the default test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
.venv/bin/python -m pytest -q "$@"
