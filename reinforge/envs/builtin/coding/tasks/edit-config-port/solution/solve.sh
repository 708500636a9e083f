#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
import json
config = json.load(open("config.json"))
config.update(port=8080, debug=False)
json.dump(config, open("config.json", "w"), indent=2)
EOF
