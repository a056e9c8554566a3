#!/usr/bin/env bash
# Set up .venv and run the closed-loop demo on the embedded example supernode: an embedded MQTT
# broker (mosquitto when installed, otherwise a pure-Python one), the simulator and the agent.
# Extra arguments go to 'racktwin demo' (e.g. --minutes 30 --speed 60).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh "broker"
exec .venv/bin/racktwin demo "$@"
