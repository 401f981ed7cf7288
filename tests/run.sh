#!/usr/bin/env bash
# The one test command: builds Strata and runs every test.
#   tests/run.sh            all tests
# Fixtures under tests/fixtures/ are committed; tools/make_fixtures.py regenerates them
# (needs the reference stack in tools/requirements-ref.txt, never needed here).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
cargo test --release --locked --no-fail-fast "$@"
