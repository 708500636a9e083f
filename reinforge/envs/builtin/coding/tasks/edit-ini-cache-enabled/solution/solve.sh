#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
import configparser

config = configparser.ConfigParser(interpolation=None)
config.read("app.cfg")
config["cache"]["enabled"] = "yes"
with open("app.cfg", "w") as f:
    config.write(f)
EOF
