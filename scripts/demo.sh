#!/usr/bin/env bash
# Set up (idempotent) and run the main job offline on CPU with the embedded default.
# Extra arguments go to `python -m testbed.demo`.
set -euo pipefail
SWEET_SETUP=main source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
.venv/bin/python -m testbed.demo "$@"
