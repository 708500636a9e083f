#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
import json

with open("preferences.json") as f:
    prefs = json.load(f)
del prefs["legacy_mode"]
with open("preferences.json", "w") as f:
    json.dump(prefs, f, indent=2)
EOF
