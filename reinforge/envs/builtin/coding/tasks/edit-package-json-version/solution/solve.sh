#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
import json

with open("package.json") as f:
    package = json.load(f)
package["version"] = "1.1.0"
with open("package.json", "w") as f:
    json.dump(package, f, indent=2)
EOF
